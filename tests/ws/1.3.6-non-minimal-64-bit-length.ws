=== description
A 200-byte payload declared with a 64-bit length (a 16-bit one would do): 1002.
=== options
closed yes
close 1002
=== in
binary len64 "\*200{x}"
=== out
close code=1002
