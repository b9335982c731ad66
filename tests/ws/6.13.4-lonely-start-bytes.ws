=== description
Autobahn 6.13.4 (lonely start bytes): a text message of the bytes f8 20 f9 20 fa 20, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf8 \xf9 \xfa "
close code=1000
=== out
close code=1007
=== messages
