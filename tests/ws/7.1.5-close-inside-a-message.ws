=== description
Autobahn 7.1.5: fragment 1, a close, fragment 2: the close is echoed; the message never completes.
=== options
closed yes
close 1000
=== in
text more "fragment1"
close code=1000
cont "fragment2"
=== out
close code=1000
=== messages
