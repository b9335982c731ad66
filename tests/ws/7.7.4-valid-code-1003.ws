=== description
Autobahn 7.7.4: close with the valid code 1003: echoed with the same code.
=== options
closed yes
close 1003
=== in
close code=1003
=== out
close code=1003
