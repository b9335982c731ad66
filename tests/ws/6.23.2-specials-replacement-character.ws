=== description
Autobahn 6.23.2 (specials, replacement character): a text message of the bytes ef bf ba, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xba"
close code=1000
=== out
text "\xef\xbf\xba"
close code=1000
