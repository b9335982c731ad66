=== description
Autobahn 5.19 (5.20 in pieces): five text fragments with a ping after the 2nd and another after the 4th: both pongs go out before the message is whole; then the echo.
=== options
closed yes
close 1000
=== in
text more "fragment1"
cont more "fragment2"
ping "pongme 1!"
cont more "fragment3"
cont more "fragment4"
ping "pongme 2!"
cont "fragment5"
close code=1000
=== out
pong "pongme 1!"
pong "pongme 2!"
text "fragment1fragment2fragment3fragment4fragment5"
close code=1000
