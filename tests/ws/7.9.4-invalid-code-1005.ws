=== description
Autobahn 7.9.4: close with the invalid code 1005: 1002.
=== options
closed yes
close 1002
=== in
close code=1005
=== out
close code=1002
