=== description
Autobahn 6.14.8 (last continuation byte missing): a text message of the bytes f7 bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf7\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
