=== description
Autobahn 1.2.5: a binary message of 128 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*128{\xfe}"
close code=1000
=== out
binary "\*128{\xfe}"
close code=1000
=== messages
binary "\*128{\xfe}"
