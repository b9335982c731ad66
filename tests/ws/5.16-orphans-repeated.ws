=== description
Autobahn 5.16: repeated twice, an orphan continuation (no FIN) and a two-fragment text: the first orphan fails the connection.
=== options
closed yes
close 1002
=== in
cont more "fragment1"
text more "fragment2"
cont "fragment3"
cont more "fragment1"
text more "fragment2"
cont "fragment3"
=== out
close code=1002
=== messages
