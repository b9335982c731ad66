=== description
Autobahn 6.8.2 (first 5- and 6-byte sequences (beyond U+10FFFF)): a text message of the bytes fc 84 80 80 80 80, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xfc\x84\x80\x80\x80\x80"
close code=1000
=== out
close code=1007
=== messages
