=== description
Autobahn 6.9.3 (last sequence of each length): a text message of the bytes ef bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbf"
close code=1000
=== out
text "\xef\xbf\xbf"
close code=1000
