=== description
Autobahn 1.2.3: a binary message of 126 bytes (0xFE) in one masked frame; echoed.
=== options
closed yes
close 1000
=== in
binary "\*126{\xfe}"
close code=1000
=== out
binary "\*126{\xfe}"
close code=1000
=== messages
binary "\*126{\xfe}"
