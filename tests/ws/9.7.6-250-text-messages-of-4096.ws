=== description
Autobahn 9.7.6, scaled from 1000 messages: 250 text messages of 4096 bytes back to back; each echoed, in order.
=== options
closed yes
close 1000
=== in
*250 text "\*4096{*}"
close code=1000
=== out
*250 text "\*4096{*}"
close code=1000
