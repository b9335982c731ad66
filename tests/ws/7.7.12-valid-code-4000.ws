=== description
Autobahn 7.7.12: close with the valid code 4000: echoed with the same code.
=== options
closed yes
close 4000
=== in
close code=4000
=== out
close code=4000
