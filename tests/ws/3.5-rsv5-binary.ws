=== description
Autobahn 3.5: a binary frame with RSV = 5: 1002.
=== options
closed yes
close 1002
=== in
binary rsv=5 hex:00ff00ff
=== out
close code=1002
