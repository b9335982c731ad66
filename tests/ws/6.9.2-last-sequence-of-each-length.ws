=== description
Autobahn 6.9.2 (last sequence of each length): a text message of the bytes df bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xdf\xbf"
close code=1000
=== out
text "\xdf\xbf"
close code=1000
