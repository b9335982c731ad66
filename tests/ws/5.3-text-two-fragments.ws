=== description
Autobahn 5.3 (5.4 and 5.5 send it in pieces: every split is tried): a text message in two fragments, reassembled.
=== options
closed yes
close 1000
=== in
text more "fragment1"
cont "fragment2"
close code=1000
=== out
text "fragment1fragment2"
close code=1000
=== messages
text "fragment1fragment2"
