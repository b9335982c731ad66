=== description
Autobahn 7.7.5: close with the valid code 1007: echoed with the same code.
=== options
closed yes
close 1007
=== in
close code=1007
=== out
close code=1007
