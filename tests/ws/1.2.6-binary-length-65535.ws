=== description
Autobahn 1.2.6: a binary message of 65535 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*65535{\xfe}"
close code=1000
=== out
binary "\*65535{\xfe}"
close code=1000
=== messages
binary "\*65535{\xfe}"
