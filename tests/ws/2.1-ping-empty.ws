=== description
Autobahn 2.1: a ping without payload; answered with an empty pong.
=== options
closed yes
close 1000
=== in
ping
close code=1000
=== out
pong
close code=1000
=== messages
