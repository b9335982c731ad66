=== description
Autobahn 6.22.33 (noncharacters (valid UTF-8)): a text message of the bytes f4 8f bf be, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf4\x8f\xbf\xbe"
close code=1000
=== out
text "\xf4\x8f\xbf\xbe"
close code=1000
