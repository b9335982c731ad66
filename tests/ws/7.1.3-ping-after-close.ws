=== description
Autobahn 7.1.3: a ping after the close frame gets no pong.
=== options
closed yes
close 1000
=== in
close code=1000
ping "after close"
=== out
close code=1000
