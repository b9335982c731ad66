=== description
Autobahn 9.3.x, scaled from 4 MiB to 256 KiB: a text message in 4096 fragments of 64 bytes; reassembled (the buffer doubles, no allocation per frame) and echoed.
=== options
closed yes
close 1000
=== in
text more "\*64{*}"
*4094 cont more "\*64{*}"
cont "\*64{*}"
close code=1000
=== out
text "\*262144{*}"
close code=1000
