=== description
max_message 1024: a 1024-byte message is delivered.
=== options
max_message 1024
closed yes
close 1000
=== in
binary "\*1024{m}"
close code=1000
=== out
binary "\*1024{m}"
close code=1000
