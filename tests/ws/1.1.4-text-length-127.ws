=== description
Autobahn 1.1.4: a text message of 127 bytes ("*") in one masked frame (16-bit length); echoed in an unmasked frame.
=== options
closed yes
close 1000
=== in
text "\*127{*}"
close code=1000
=== out
text "\*127{*}"
close code=1000
=== messages
text "\*127{*}"
