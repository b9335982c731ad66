=== description
Autobahn 7.7.7: close with the valid code 1009: echoed with the same code.
=== options
closed yes
close 1009
=== in
close code=1009
=== out
close code=1009
