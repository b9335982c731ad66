=== description
Autobahn 9.2.2: a binary message of 256 KiB in one frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*262144{\xfe}"
close code=1000
=== out
binary "\*262144{\xfe}"
close code=1000
