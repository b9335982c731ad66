=== description
Autobahn 7.7.11: close with the valid code 3999: echoed with the same code.
=== options
closed yes
close 3999
=== in
close code=3999
=== out
close code=3999
