=== description
Binary message of five fragments, some empty: reassembled to 6 bytes.
=== options
closed yes
close 1000
=== in
binary more hex:0001
cont more
cont more hex:0203
cont more
cont hex:0405
close code=1000
=== out
binary hex:000102030405
close code=1000
