=== description
Autobahn 7.3.6: close 1000 with a 124-byte reason (126 bytes, a 16-bit length): control frame too long: 1002.
=== options
closed yes
close 1002
=== in
close code=1000 "\*124{*}"
=== out
close code=1002
