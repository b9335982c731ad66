=== description
Autobahn 7.3.3: close 1000 without reason: echoed.
=== options
closed yes
close 1000
=== in
close code=1000
=== out
close code=1000
