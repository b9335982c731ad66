=== description
Autobahn 7.7.3: close with the valid code 1002: echoed with the same code.
=== options
closed yes
close 1002
=== in
close code=1002
=== out
close code=1002
