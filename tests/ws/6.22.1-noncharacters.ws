=== description
Autobahn 6.22.1 (noncharacters (valid UTF-8)): a text message of the bytes ef bf be, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbe"
close code=1000
=== out
text "\xef\xbf\xbe"
close code=1000
