=== description
A fragmented binary message keeps its type: the continuation frames carry opcode 0, the echo is binary.
=== options
closed yes
close 1000
=== in
binary more "abc"
cont "\xff"
close code=1000
=== out
binary "abc\xff"
close code=1000
