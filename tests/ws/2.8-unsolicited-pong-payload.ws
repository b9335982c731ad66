=== description
Autobahn 2.8: an unsolicited pong with payload is ignored.
=== options
closed yes
close 1000
=== in
pong "unsolicited pong payload"
close code=1000
=== out
close code=1000
