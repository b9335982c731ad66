=== description
Autobahn 7.9.3: close with the invalid code 1004: 1002.
=== options
closed yes
close 1002
=== in
close code=1004
=== out
close code=1002
