=== description
Autobahn 6.20.5 (single UTF-16 surrogates): a text message of the bytes ed b0 80, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xed\xb0\x80"
close code=1000
=== out
close code=1007
=== messages
