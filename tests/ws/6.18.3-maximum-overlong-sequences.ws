=== description
Autobahn 6.18.3 (maximum overlong sequences): a text message of the bytes f0 8f bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf0\x8f\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
