=== description
Autobahn 7.9.2: close with the invalid code 999: 1002.
=== options
closed yes
close 1002
=== in
close code=999
=== out
close code=1002
