=== description
Autobahn 5.6 (5.7, 5.8 in pieces): a ping between two text fragments is answered at once; then the message is echoed.
=== options
closed yes
close 1000
=== in
text more "fragment1"
ping "ping payload"
cont "fragment2"
close code=1000
=== out
pong "ping payload"
text "fragment1fragment2"
close code=1000
