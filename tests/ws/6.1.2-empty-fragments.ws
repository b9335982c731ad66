=== description
Autobahn 6.1.2: a text message of three empty fragments; echoed as one empty message.
=== options
closed yes
close 1000
=== in
text more ""
cont more ""
cont ""
close code=1000
=== out
text ""
close code=1000
=== messages
text ""
