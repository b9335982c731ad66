=== description
A close frame between the fragments of a message is handled at once: echoed, and the message is dropped.
=== options
closed yes
close 1000
=== in
text more "fragment1"
close code=1000
cont "fragment2"
=== out
close code=1000
=== messages
