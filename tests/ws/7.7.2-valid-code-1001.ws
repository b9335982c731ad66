=== description
Autobahn 7.7.2: close with the valid code 1001: echoed with the same code.
=== options
closed yes
close 1001
=== in
close code=1001
=== out
close code=1001
