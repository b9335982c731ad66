=== description
A client frame without the MASK bit: protocol error 1002 (RFC 6455 §5.1: the server MUST close).
=== options
closed yes
close 1002
=== in
text nomask "Hello"
text "never read"
=== out
close code=1002
