=== description
Autobahn 7.7.13: close with the valid code 4999: echoed with the same code.
=== options
closed yes
close 4999
=== in
close code=4999
=== out
close code=4999
