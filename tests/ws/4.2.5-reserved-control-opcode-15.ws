=== description
Autobahn 4.2.5: a frame with the reserved control opcode 15 after an echoed message: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
text "Hello, world!"
op15 "reserved opcode payload"
ping
=== out
text "Hello, world!"
close code=1002
=== messages
text "Hello, world!"
