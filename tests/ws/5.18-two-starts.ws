=== description
Autobahn 5.18: a text message in two fragments whose second is also a text (not continuation) frame: 1002.
=== options
closed yes
close 1002
=== in
text more "fragment1"
text "fragment2"
=== out
close code=1002
=== messages
