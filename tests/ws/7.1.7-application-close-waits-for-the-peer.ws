=== description
The application closes first (1001): afterwards data frames and pings are ignored (no echo, no pong) until the peer's close arrives, which ends the connection without a second close frame.
=== options
app_close 1001
closed yes
close 1001
=== in
text "ignored"
ping "no pong"
binary more "frag"
close code=1001
=== out
close code=1001
=== messages
