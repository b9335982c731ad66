=== description
Autobahn 1.1.6: a text message of 65535 bytes ("*") in one masked frame (16-bit length); echoed in an unmasked frame.
=== options
closed yes
close 1000
=== in
text "\*65535{*}"
close code=1000
=== out
text "\*65535{*}"
close code=1000
=== messages
text "\*65535{*}"
