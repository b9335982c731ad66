=== description
Autobahn 9.7.2: 1000 text messages of 16 bytes back to back; each echoed, in order.
=== options
closed yes
close 1000
=== in
*1000 text "\*16{*}"
close code=1000
=== out
*1000 text "\*16{*}"
close code=1000
