=== description
Autobahn 6.22.18 (noncharacters (valid UTF-8)): a text message of the bytes f2 8f bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf2\x8f\xbf\xbf"
close code=1000
=== out
text "\xf2\x8f\xbf\xbf"
close code=1000
