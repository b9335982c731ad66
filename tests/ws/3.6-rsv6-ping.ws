=== description
Autobahn 3.6: a ping with RSV = 6: 1002, no pong.
=== options
closed yes
close 1002
=== in
ping rsv=6 "Hello, world!"
=== out
close code=1002
