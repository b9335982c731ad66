=== description
Autobahn 6.9.1 (last sequence of each length): a text message of the bytes 7f, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\x7f"
close code=1000
=== out
text "\x7f"
close code=1000
