=== description
Autobahn 7.7.6: close with the valid code 1008: echoed with the same code.
=== options
closed yes
close 1008
=== in
close code=1008
=== out
close code=1008
