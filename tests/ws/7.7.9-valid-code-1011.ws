=== description
Autobahn 7.7.9: close with the valid code 1011: echoed with the same code.
=== options
closed yes
close 1011
=== in
close code=1011
=== out
close code=1011
