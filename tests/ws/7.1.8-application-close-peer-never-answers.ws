=== description
The application closes first and the peer keeps sending data: the connection stays in CLOSING (the server's timer ends it).
=== options
app_close 1000
closed no
close none
=== in
text "one"
text "two"
=== out
close code=1000
=== messages
