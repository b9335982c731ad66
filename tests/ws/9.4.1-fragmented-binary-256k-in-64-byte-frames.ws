=== description
Autobahn 9.4.x, scaled from 4 MiB to 256 KiB: a binary message in 4096 fragments of 64 bytes; echoed.
=== options
closed yes
close 1000
=== in
binary more "\*64{\xfe}"
*4094 cont more "\*64{\xfe}"
cont "\*64{\xfe}"
close code=1000
=== out
binary "\*262144{\xfe}"
close code=1000
