=== description
Autobahn 4.1.4: a frame with the reserved non-control opcode 6 after an echoed message: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
text "Hello, world!"
op6 "reserved opcode payload"
ping
=== out
text "Hello, world!"
close code=1002
=== messages
text "Hello, world!"
