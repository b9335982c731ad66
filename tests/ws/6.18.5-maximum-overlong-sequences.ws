=== description
Autobahn 6.18.5 (maximum overlong sequences): a text message of the bytes fc 83 bf bf bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xfc\x83\xbf\xbf\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
