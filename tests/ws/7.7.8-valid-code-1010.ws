=== description
Autobahn 7.7.8: close with the valid code 1010: echoed with the same code.
=== options
closed yes
close 1010
=== in
close code=1010
=== out
close code=1010
