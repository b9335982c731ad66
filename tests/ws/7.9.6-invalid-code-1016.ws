=== description
Autobahn 7.9.6: close with the invalid code 1016: 1002.
=== options
closed yes
close 1002
=== in
close code=1016
=== out
close code=1002
