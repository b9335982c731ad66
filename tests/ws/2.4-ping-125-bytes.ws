=== description
Autobahn 2.4 (and 2.6, sent in pieces: every split is tried): a ping with 125 bytes, the most a control frame holds.
=== options
closed yes
close 1000
=== in
ping "\*125{\xfe}"
close code=1000
=== out
pong "\*125{\xfe}"
close code=1000
