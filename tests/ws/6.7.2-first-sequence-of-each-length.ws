=== description
Autobahn 6.7.2 (first sequence of each length): a text message of the bytes c2 80, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xc2\x80"
close code=1000
=== out
text "\xc2\x80"
close code=1000
