=== description
Autobahn 2.3: a ping with a binary payload; the pong carries the same bytes.
=== options
closed yes
close 1000
=== in
ping hex:00fffefdfcfb00ff
close code=1000
=== out
pong hex:00fffefdfcfb00ff
close code=1000
