=== description
Autobahn 6.10.1 (last 4-, 5-, 6-byte forms (beyond U+10FFFF)): a text message of the bytes f7 bf bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf7\xbf\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
