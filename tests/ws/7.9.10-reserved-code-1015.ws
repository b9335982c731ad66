=== description
Code 1015 (TLS handshake failure) must never be sent in a close frame (RFC 6455 §7.4.1): 1002.
=== options
closed yes
close 1002
=== in
close code=1015
=== out
close code=1002
