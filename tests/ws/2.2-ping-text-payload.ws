=== description
Autobahn 2.2: a ping with a text payload; the pong carries the same bytes.
=== options
closed yes
close 1000
=== in
ping "Hello, world!"
close code=1000
=== out
pong "Hello, world!"
close code=1000
