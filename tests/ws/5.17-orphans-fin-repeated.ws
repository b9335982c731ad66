=== description
Autobahn 5.17: as 5.16 with FIN set on the orphan continuation: 1002.
=== options
closed yes
close 1002
=== in
cont "fragment1"
text more "fragment2"
cont "fragment3"
cont "fragment1"
text more "fragment2"
cont "fragment3"
=== out
close code=1002
=== messages
