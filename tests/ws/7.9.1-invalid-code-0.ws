=== description
Autobahn 7.9.1: close with the invalid code 0: 1002.
=== options
closed yes
close 1002
=== in
close code=0
=== out
close code=1002
