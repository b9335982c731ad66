=== description
Autobahn 9.4.x, scaled from 4 MiB to 256 KiB: a binary message in 64 fragments of 4096 bytes; echoed.
=== options
closed yes
close 1000
=== in
binary more "\*4096{\xfe}"
*62 cont more "\*4096{\xfe}"
cont "\*4096{\xfe}"
close code=1000
=== out
binary "\*262144{\xfe}"
close code=1000
