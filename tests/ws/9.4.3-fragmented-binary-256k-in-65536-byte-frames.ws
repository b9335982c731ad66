=== description
Autobahn 9.4.x, scaled from 4 MiB to 256 KiB: a binary message in 4 fragments of 65536 bytes; echoed.
=== options
closed yes
close 1000
=== in
binary more "\*65536{\xfe}"
*2 cont more "\*65536{\xfe}"
cont "\*65536{\xfe}"
close code=1000
=== out
binary "\*262144{\xfe}"
close code=1000
