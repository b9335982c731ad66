=== description
Autobahn 6.14.6 (last continuation byte missing): a text message of the bytes df, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xdf"
close code=1000
=== out
close code=1007
=== messages
