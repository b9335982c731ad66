=== description
Autobahn 7.9.8: close with the invalid code 2000: 1002.
=== options
closed yes
close 1002
=== in
close code=2000
=== out
close code=1002
