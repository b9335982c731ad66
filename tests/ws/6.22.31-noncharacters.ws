=== description
Autobahn 6.22.31 (noncharacters (valid UTF-8)): a text message of the bytes f3 bf bf be, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf3\xbf\xbf\xbe"
close code=1000
=== out
text "\xf3\xbf\xbf\xbe"
close code=1000
