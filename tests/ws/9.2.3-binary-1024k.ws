=== description
Autobahn 9.2.3: a binary message of 1024 KiB in one frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*1048576{\xfe}"
close code=1000
=== out
binary "\*1048576{\xfe}"
close code=1000
