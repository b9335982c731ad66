=== description
Autobahn 6.14.7 (last continuation byte missing): a text message of the bytes ef bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xef\xbf"
close code=1000
=== out
close code=1007
=== messages
