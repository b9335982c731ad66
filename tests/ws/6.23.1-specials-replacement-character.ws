=== description
Autobahn 6.23.1 (specials, replacement character): a text message of the bytes ef bf b9, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xb9"
close code=1000
=== out
text "\xef\xbf\xb9"
close code=1000
