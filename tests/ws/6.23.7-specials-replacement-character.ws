=== description
Autobahn 6.23.7 (specials, replacement character): a text message of the bytes ef bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbf"
close code=1000
=== out
text "\xef\xbf\xbf"
close code=1000
