=== description
Autobahn 1.2.1: a binary message of 0 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*0{\xfe}"
close code=1000
=== out
binary "\*0{\xfe}"
close code=1000
=== messages
binary "\*0{\xfe}"
