=== description
max_message 1024: a 1025-byte frame fails with 1009 at its header, before any payload byte.
=== options
max_message 1024
closed yes
close 1009
=== in
binary len=1025
=== out
close code=1009
=== messages
