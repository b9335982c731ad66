=== description
Autobahn 6.7.3 (first sequence of each length): a text message of the bytes e0 a0 80, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xe0\xa0\x80"
close code=1000
=== out
text "\xe0\xa0\x80"
close code=1000
