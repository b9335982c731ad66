=== description
Autobahn 6.20.7 (single UTF-16 surrogates): a text message of the bytes ed bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xed\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
