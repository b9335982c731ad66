=== description
Autobahn 6.13.5 (lonely start bytes): a text message of the bytes fc 20, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xfc "
close code=1000
=== out
close code=1007
=== messages
