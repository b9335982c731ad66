=== description
Autobahn 6.14.4 (last continuation byte missing): a text message of the bytes f8 80 80 80, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf8\x80\x80\x80"
close code=1000
=== out
close code=1007
=== messages
