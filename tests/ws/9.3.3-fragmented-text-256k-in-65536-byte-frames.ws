=== description
Autobahn 9.3.x, scaled from 4 MiB to 256 KiB: a text message in 4 fragments of 65536 bytes; reassembled (the buffer doubles, no allocation per frame) and echoed.
=== options
closed yes
close 1000
=== in
text more "\*65536{*}"
*2 cont more "\*65536{*}"
cont "\*65536{*}"
close code=1000
=== out
text "\*262144{*}"
close code=1000
