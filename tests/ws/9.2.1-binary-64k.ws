=== description
Autobahn 9.2.1: a binary message of 64 KiB in one frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*65536{\xfe}"
close code=1000
=== out
binary "\*65536{\xfe}"
close code=1000
