=== description
Autobahn 7.7.10: close with the valid code 3000: echoed with the same code.
=== options
closed yes
close 3000
=== in
close code=3000
=== out
close code=3000
