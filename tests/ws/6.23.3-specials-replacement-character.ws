=== description
Autobahn 6.23.3 (specials, replacement character): a text message of the bytes ef bf bb, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbb"
close code=1000
=== out
text "\xef\xbf\xbb"
close code=1000
