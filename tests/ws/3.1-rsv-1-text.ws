=== description
Autobahn 3.1: a text frame with RSV = 1 (the RSV3 bit) and no extension negotiated: 1002.
=== options
closed yes
close 1002
=== in
text rsv=1 "Hello, world!"
=== out
close code=1002
=== messages
