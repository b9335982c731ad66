=== description
Autobahn 4.1.2: a frame with the reserved non-control opcode 4: 1002, failing on its first byte; nothing after it is answered.
=== options
closed yes
close 1002
=== in
op4 "reserved opcode payload"
=== out
close code=1002
=== messages
