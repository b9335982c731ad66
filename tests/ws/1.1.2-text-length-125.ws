=== description
Autobahn 1.1.2: a text message of 125 bytes ("*") in one masked frame (7-bit length); echoed in an unmasked frame.
=== options
closed yes
close 1000
=== in
text "\*125{*}"
close code=1000
=== out
text "\*125{*}"
close code=1000
=== messages
text "\*125{*}"
