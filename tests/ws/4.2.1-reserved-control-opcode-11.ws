=== description
Autobahn 4.2.1: a frame with the reserved control opcode 11: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
op11
=== out
close code=1002
=== messages
