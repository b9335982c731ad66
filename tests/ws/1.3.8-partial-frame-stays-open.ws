=== description
A frame cut short (header and 2 of 5 payload bytes): nothing is delivered and the connection waits.
=== options
closed no
close none
=== in
text len=5 "He"
=== out
=== messages
