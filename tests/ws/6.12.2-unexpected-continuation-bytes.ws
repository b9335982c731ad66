=== description
Autobahn 6.12.2 (unexpected continuation bytes): a text message of the bytes bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xbf"
close code=1000
=== out
close code=1007
=== messages
