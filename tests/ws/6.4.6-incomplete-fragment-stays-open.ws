=== description
A fragment ending inside a character (E2 82) is not an error yet: the message may still complete it.
=== options
closed no
close none
=== in
text more "a\xe2\x82"
=== out
=== messages
