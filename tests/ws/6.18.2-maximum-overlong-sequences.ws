=== description
Autobahn 6.18.2 (maximum overlong sequences): a text message of the bytes e0 9f bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xe0\x9f\xbf"
close code=1000
=== out
close code=1007
=== messages
