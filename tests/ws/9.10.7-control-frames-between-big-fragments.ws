=== description
max_message 1024: control frames do not count toward the message size; pings between full fragments are answered.
=== options
max_message 1024
closed yes
close 1000
=== in
binary more "\*512{x}"
ping "p1"
cont "\*512{y}"
ping "p2"
close code=1000
=== out
pong "p1"
binary "\*512{x}\*512{y}"
pong "p2"
close code=1000
