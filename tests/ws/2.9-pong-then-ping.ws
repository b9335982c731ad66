=== description
Autobahn 2.9: an unsolicited pong, then a ping: only the ping is answered.
=== options
closed yes
close 1000
=== in
pong "unsolicited pong payload"
ping "ping payload"
close code=1000
=== out
pong "ping payload"
close code=1000
