=== description
Autobahn 9.1.1: a text message of 64 KiB in one frame, within the default 16 MiB limit; echoed.
=== options
closed yes
close 1000
=== in
text "\*65536{*}"
close code=1000
=== out
text "\*65536{*}"
close code=1000
