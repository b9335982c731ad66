=== description
Autobahn 7.1.4: a text message after the close frame is neither delivered nor echoed.
=== options
closed yes
close 1000
=== in
close code=1000
text "Hello World!"
=== out
close code=1000
=== messages
