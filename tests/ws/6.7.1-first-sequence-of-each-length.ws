=== description
Autobahn 6.7.1 (first sequence of each length): a text message of the bytes 00, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\x00"
close code=1000
=== out
text "\x00"
close code=1000
