=== description
Autobahn 6.5.4 (some valid sequences): a text message of the bytes 68 65 6c 6c 6f f0 a4 ad a2 77 6f 72 6c 64, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "hello\xf0\xa4\xad\xa2world"
close code=1000
=== out
text "hello\xf0\xa4\xad\xa2world"
close code=1000
