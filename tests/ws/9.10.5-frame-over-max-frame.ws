=== description
max_frame 100 (max_message 1000): a fragmented message of 100-byte frames passes; a 101-byte frame fails with 1009.
=== options
max_message 1000
max_frame 100
closed yes
close 1009
=== in
binary more "\*100{a}"
cont "\*100{b}"
binary "\*101{c}"
=== out
binary "\*100{a}\*100{b}"
close code=1009
