=== description
Autobahn 6.12.7 (unexpected continuation bytes): a text message of the bytes 80 bf 80 bf 80 bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\x80\xbf\x80\xbf\x80\xbf"
close code=1000
=== out
close code=1007
=== messages
