=== description
Autobahn 6.22.16 (noncharacters (valid UTF-8)): a text message of the bytes f1 bf bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf1\xbf\xbf\xbf"
close code=1000
=== out
text "\xf1\xbf\xbf\xbf"
close code=1000
