=== description
Autobahn 6.6.6 (prefixes of a valid multi-byte string): a text message of the bytes ce ba e1 bd b9 cf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xce\xba\xe1\xbd\xb9\xcf"
close code=1000
=== out
close code=1007
=== messages
