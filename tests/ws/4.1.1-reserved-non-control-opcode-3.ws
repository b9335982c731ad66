=== description
Autobahn 4.1.1: a frame with the reserved non-control opcode 3: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
op3
=== out
close code=1002
=== messages
