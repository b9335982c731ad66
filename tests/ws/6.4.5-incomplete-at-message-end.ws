=== description
A text message whose fragments are valid so far but whose last fragment ends inside a 4-byte character (F0 9F 98): 1007 at the end of the message.
=== options
closed yes
close 1007
=== in
text more "ab"
cont more "\xf0\x9f"
cont "\x98"
=== out
close code=1007
=== messages
