=== description
Autobahn 6.5.1 (some valid sequences): a text message of the bytes 68 65 6c 6c 6f 24 77 6f 72 6c 64, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "hello$world"
close code=1000
=== out
text "hello$world"
close code=1000
