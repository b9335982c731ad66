=== description
Autobahn 9.3.x, scaled from 4 MiB to 256 KiB: a text message in 64 fragments of 4096 bytes; reassembled (the buffer doubles, no allocation per frame) and echoed.
=== options
closed yes
close 1000
=== in
text more "\*4096{*}"
*62 cont more "\*4096{*}"
cont "\*4096{*}"
close code=1000
=== out
text "\*262144{*}"
close code=1000
