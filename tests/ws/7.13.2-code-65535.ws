=== description
Autobahn 7.13.2 (left open by the RFC): code 65535: 1002.
=== options
closed yes
close 1002
=== in
close code=65535
=== out
close code=1002
