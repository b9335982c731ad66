=== description
Autobahn 7.7.1: close with the valid code 1000: echoed with the same code.
=== options
closed yes
close 1000
=== in
close code=1000
=== out
close code=1000
