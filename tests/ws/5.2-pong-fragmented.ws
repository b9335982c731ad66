=== description
Autobahn 5.2: a pong in two fragments: 1002.
=== options
closed yes
close 1002
=== in
pong more "fragment1"
cont "fragment2"
=== out
close code=1002
