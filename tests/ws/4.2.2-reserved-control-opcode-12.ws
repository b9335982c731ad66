=== description
Autobahn 4.2.2: a frame with the reserved control opcode 12: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
op12 "reserved opcode payload"
=== out
close code=1002
=== messages
