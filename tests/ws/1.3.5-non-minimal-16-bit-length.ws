=== description
A 5-byte payload declared with a 16-bit length: §5.2 requires the minimal encoding; strict: 1002.
=== options
closed yes
close 1002
=== in
text len16 "Hello"
=== out
close code=1002
