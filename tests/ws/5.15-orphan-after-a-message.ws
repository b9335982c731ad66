=== description
Autobahn 5.15: a two-fragment message (echoed), then a continuation with nothing to continue: 1002.
=== options
closed yes
close 1002
=== in
text more "fragment1"
cont "fragment2"
cont more "fragment3"
text "fragment4"
=== out
text "fragment1fragment2"
close code=1002
=== messages
text "fragment1fragment2"
