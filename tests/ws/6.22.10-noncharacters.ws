=== description
Autobahn 6.22.10 (noncharacters (valid UTF-8)): a text message of the bytes f1 8f bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf1\x8f\xbf\xbf"
close code=1000
=== out
text "\xf1\x8f\xbf\xbf"
close code=1000
