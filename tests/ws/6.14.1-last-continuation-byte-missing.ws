=== description
Autobahn 6.14.1 (last continuation byte missing): a text message of the bytes c0, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xc0"
close code=1000
=== out
close code=1007
=== messages
