=== description
Autobahn 6.22.20 (noncharacters (valid UTF-8)): a text message of the bytes f2 9f bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf2\x9f\xbf\xbf"
close code=1000
=== out
text "\xf2\x9f\xbf\xbf"
close code=1000
