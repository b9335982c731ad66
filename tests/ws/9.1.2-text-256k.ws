=== description
Autobahn 9.1.2: a text message of 256 KiB in one frame, within the default 16 MiB limit; echoed.
=== options
closed yes
close 1000
=== in
text "\*262144{*}"
close code=1000
=== out
text "\*262144{*}"
close code=1000
