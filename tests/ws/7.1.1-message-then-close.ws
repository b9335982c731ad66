=== description
Autobahn 7.1.1: a message (echoed), then a close 1000 (echoed with 1000); the server then closes the TCP connection.
=== options
closed yes
close 1000
=== in
text "Hello World!"
close code=1000
=== out
text "Hello World!"
close code=1000
