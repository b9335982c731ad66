=== description
Autobahn 6.17.2 (overlong slash): a text message of the bytes e0 80 af, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xe0\x80\xaf"
close code=1000
=== out
close code=1007
=== messages
