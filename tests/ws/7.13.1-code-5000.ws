=== description
Autobahn 7.13.1 (behaviour left open by the RFC): code 5000 is outside every range: 1002.
=== options
closed yes
close 1002
=== in
close code=5000
=== out
close code=1002
