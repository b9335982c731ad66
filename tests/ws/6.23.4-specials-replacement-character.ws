=== description
Autobahn 6.23.4 (specials, replacement character): a text message of the bytes ef bf bc, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbc"
close code=1000
=== out
text "\xef\xbf\xbc"
close code=1000
