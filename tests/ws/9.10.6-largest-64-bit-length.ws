=== description
The largest length a frame can declare (2^63 - 1) against the default 16 MiB limit: 1009 from the header; nothing is allocated.
=== options
closed yes
close 1009
=== in
raw 82 ff 7f ff ff ff ff ff ff ff 01 02 03 04
=== out
close code=1009
