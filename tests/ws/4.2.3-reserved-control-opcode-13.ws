=== description
Autobahn 4.2.3: a frame with the reserved control opcode 13 after an echoed message: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
text "Hello, world!"
op13
ping
=== out
text "Hello, world!"
close code=1002
=== messages
text "Hello, world!"
