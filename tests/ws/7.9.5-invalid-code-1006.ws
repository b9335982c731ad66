=== description
Autobahn 7.9.5: close with the invalid code 1006: 1002.
=== options
closed yes
close 1002
=== in
close code=1006
=== out
close code=1002
