=== description
max_message 1024: 400 + 400 + 224 bytes make exactly 1024: delivered.
=== options
max_message 1024
closed yes
close 1000
=== in
text more "\*400{*}"
cont more "\*400{*}"
cont "\*224{*}"
close code=1000
=== out
text "\*1024{*}"
close code=1000
