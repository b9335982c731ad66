=== description
Autobahn 6.17.1 (overlong slash): a text message of the bytes c0 af, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xc0\xaf"
close code=1000
=== out
close code=1007
=== messages
