=== description
Autobahn 7.9.9: close with the invalid code 2999: 1002.
=== options
closed yes
close 1002
=== in
close code=2999
=== out
close code=1002
