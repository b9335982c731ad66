=== description
max_message 1024: fragments of 400 bytes; the third would make 1200 bytes: 1009 at its header (the first two were buffered, nothing more).
=== options
max_message 1024
closed yes
close 1009
=== in
text more "\*400{*}"
cont more "\*400{*}"
cont len=400
=== out
close code=1009
=== messages
