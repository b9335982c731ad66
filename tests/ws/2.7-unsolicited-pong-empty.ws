=== description
Autobahn 2.7: an unsolicited pong without payload is ignored.
=== options
closed yes
close 1000
=== in
pong
close code=1000
=== out
close code=1000
