=== description
Autobahn 5.9 (5.10, 5.11 in pieces): a continuation frame (FIN) with no message to continue, then a text message: 1002.
=== options
closed yes
close 1002
=== in
cont "non-continuation payload"
text "Hello, world!"
=== out
close code=1002
=== messages
