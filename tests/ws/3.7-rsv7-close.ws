=== description
Autobahn 3.7: a close frame with RSV = 7: 1002 (not an echo of the close).
=== options
closed yes
close 1002
=== in
close rsv=7 code=1000
=== out
close code=1002
