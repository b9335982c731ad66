=== description
Autobahn 5.1: a ping in two fragments: control frames are never fragmented: 1002.
=== options
closed yes
close 1002
=== in
ping more "fragment1"
cont "fragment2"
=== out
close code=1002
