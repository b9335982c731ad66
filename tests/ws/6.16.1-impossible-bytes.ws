=== description
Autobahn 6.16.1 (impossible bytes): a text message of the bytes fe, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xfe"
close code=1000
=== out
close code=1007
=== messages
