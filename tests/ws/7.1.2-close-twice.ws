=== description
Autobahn 7.1.2: two close frames: the second is never read (one echo, one on_close).
=== options
closed yes
close 1000
=== in
close code=1000
close code=1000
=== out
close code=1000
