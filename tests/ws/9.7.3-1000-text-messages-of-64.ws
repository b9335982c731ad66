=== description
Autobahn 9.7.3: 1000 text messages of 64 bytes back to back; each echoed, in order.
=== options
closed yes
close 1000
=== in
*1000 text "\*64{*}"
close code=1000
=== out
*1000 text "\*64{*}"
close code=1000
