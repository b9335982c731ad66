=== description
Autobahn 6.20.3 (single UTF-16 surrogates): a text message of the bytes ed ae 80, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xed\xae\x80"
close code=1000
=== out
close code=1007
=== messages
