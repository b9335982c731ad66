=== description
Autobahn 7.9.7: close with the invalid code 1100: 1002.
=== options
closed yes
close 1002
=== in
close code=1100
=== out
close code=1002
