=== description
Autobahn 6.13.3 (lonely start bytes): a text message of the bytes f0 20 f1 20 f2 20 f3 20 f4 20 f5 20 f6 20, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf0 \xf1 \xf2 \xf3 \xf4 \xf5 \xf6 "
close code=1000
=== out
close code=1007
=== messages
