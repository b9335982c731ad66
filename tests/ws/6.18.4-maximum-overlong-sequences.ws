=== description
Autobahn 6.18.4 (maximum overlong sequences): a text message of the bytes f8 87 bf bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf8\x87\xbf\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
