=== description
Autobahn 6.18.1 (maximum overlong sequences): a text message of the bytes c1 bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xc1\xbf"
close code=1000
=== out
close code=1007
=== messages
