=== description
Autobahn 7.3.4: close 1000 with a reason: the code is echoed (without the reason).
=== options
closed yes
close 1000
=== in
close code=1000 "Hello World!"
=== out
close code=1000
