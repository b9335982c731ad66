=== description
A 64-bit length with its most significant bit set: 1002 (§5.2), known from the header alone.
=== options
closed yes
close 1002
=== in
raw 82 ff 80 00 00 00 00 00 00 05 01 02 03 04
=== out
close code=1002
