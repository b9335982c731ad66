=== description
Autobahn 2.5: a ping with 126 bytes (a 16-bit length): control frames are at most 125 bytes, so 1002 and no pong.
=== options
closed yes
close 1002
=== in
ping "\*126{\xfe}"
close code=1000
=== out
close code=1002
