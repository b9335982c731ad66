=== description
RFC 6455 §5.7: the masked "Hello" frame, written as raw bytes; the echo is the unmasked example frame.
=== options
closed no
close none
=== in
raw 81 85 37 fa 21 3d 7f 9f 4d 51 58
=== out
raw 81 05 48 65 6c 6c 6f
=== messages
text "Hello"
