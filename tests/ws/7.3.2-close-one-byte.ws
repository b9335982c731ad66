=== description
Autobahn 7.3.2: a close frame with a 1-byte payload: 1002.
=== options
closed yes
close 1002
=== in
close "a"
=== out
close code=1002
