=== description
RFC 6455 §5.7 ping/pong example: a masked ping "Hello" is answered by the unmasked pong "Hello".
=== options
closed no
=== in
raw 89 85 37 fa 21 3d 7f 9f 4d 51 58
=== out
raw 8a 05 48 65 6c 6c 6f
