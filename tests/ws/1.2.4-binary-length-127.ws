=== description
Autobahn 1.2.4: a binary message of 127 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*127{\xfe}"
close code=1000
=== out
binary "\*127{\xfe}"
close code=1000
=== messages
binary "\*127{\xfe}"
