=== description
Autobahn 6.5.2 (some valid sequences): a text message of the bytes 68 65 6c 6c 6f c2 a2 77 6f 72 6c 64, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "hello\xc2\xa2world"
close code=1000
=== out
text "hello\xc2\xa2world"
close code=1000
