=== description
Autobahn 6.1.3: empty, non-empty, empty fragments.
=== options
closed yes
close 1000
=== in
text more ""
cont more "middle frame payload"
cont ""
close code=1000
=== out
text "middle frame payload"
close code=1000
