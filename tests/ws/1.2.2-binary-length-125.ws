=== description
Autobahn 1.2.2: a binary message of 125 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*125{\xfe}"
close code=1000
=== out
binary "\*125{\xfe}"
close code=1000
=== messages
binary "\*125{\xfe}"
