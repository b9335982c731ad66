=== description
Autobahn 3.2: a text message, the same with RSV = 2, then a ping: the first is echoed, then 1002; the ping is never answered.
=== options
closed yes
close 1002
=== in
text "Hello, world!"
text rsv=2 "Hello, world!"
ping
=== out
text "Hello, world!"
close code=1002
=== messages
text "Hello, world!"
