=== description
Autobahn 7.1.6: a 256 KiB text message, a short one, a close and a ping: both messages are echoed in order, then the close; no pong.
=== options
closed yes
close 1000
=== in
text "\*26215{BAsd7&jh23}BAsd7&"
text "Hello World!"
close code=1000
ping
=== out
text "\*26215{BAsd7&jh23}BAsd7&"
text "Hello World!"
close code=1000
