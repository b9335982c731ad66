=== description
Autobahn 1.1.3: a text message of 126 bytes ("*") in one masked frame (16-bit length); echoed in an unmasked frame.
=== options
closed yes
close 1000
=== in
text "\*126{*}"
close code=1000
=== out
text "\*126{*}"
close code=1000
=== messages
text "\*126{*}"
