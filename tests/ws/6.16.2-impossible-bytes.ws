=== description
Autobahn 6.16.2 (impossible bytes): a text message of the bytes ff, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xff"
close code=1000
=== out
close code=1007
=== messages
