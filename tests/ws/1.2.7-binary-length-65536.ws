=== description
Autobahn 1.2.7: a binary message of 65536 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*65536{\xfe}"
close code=1000
=== out
binary "\*65536{\xfe}"
close code=1000
=== messages
binary "\*65536{\xfe}"
