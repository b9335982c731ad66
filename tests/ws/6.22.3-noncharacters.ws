=== description
Autobahn 6.22.3 (noncharacters (valid UTF-8)): a text message of the bytes f0 9f bf be, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf0\x9f\xbf\xbe"
close code=1000
=== out
text "\xf0\x9f\xbf\xbe"
close code=1000
