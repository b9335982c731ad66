=== description
Autobahn 6.1.1: a text message of length 0; echoed.
=== options
closed yes
close 1000
=== in
text ""
close code=1000
=== out
text ""
close code=1000
=== messages
text ""
