=== description
Autobahn 6.6.1 (prefixes of a valid multi-byte string): a text message of the bytes ce, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xce"
close code=1000
=== out
close code=1007
=== messages
