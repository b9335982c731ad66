=== description
Autobahn 6.6.2 (prefixes of a valid multi-byte string): a text message of the bytes ce ba, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xce\xba"
close code=1000
=== out
text "\xce\xba"
close code=1000
