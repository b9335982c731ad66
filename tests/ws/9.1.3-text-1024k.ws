=== description
Autobahn 9.1.3: a text message of 1024 KiB in one frame, within the default 16 MiB limit; echoed.
=== options
closed yes
close 1000
=== in
text "\*1048576{*}"
close code=1000
=== out
text "\*1048576{*}"
close code=1000
