=== description
Autobahn 6.22.6 (noncharacters (valid UTF-8)): a text message of the bytes f0 af bf bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf0\xaf\xbf\xbf"
close code=1000
=== out
text "\xf0\xaf\xbf\xbf"
close code=1000
