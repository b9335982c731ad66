=== description
Frames with different masking keys, one of them all zero (a no-op mask is still a mask).
=== options
closed yes
close 1000
=== in
text mask=00000000 "zero key"
text mask=ffffffff "ones"
binary mask=01020304 hex:0001020304050607080910
close code=1000
=== out
text "zero key"
text "ones"
binary hex:0001020304050607080910
close code=1000
