=== description
Autobahn 1.1.7: a text message of 65536 bytes ("*") in one masked frame (64-bit length); echoed in an unmasked frame.
=== options
closed yes
close 1000
=== in
text "\*65536{*}"
close code=1000
=== out
text "\*65536{*}"
close code=1000
=== messages
text "\*65536{*}"
