=== description
Autobahn 9.8.6, scaled from 1000 messages: 250 binary messages of 4096 bytes back to back.
=== options
closed yes
close 1000
=== in
*250 binary "\*4096{\xfe}"
close code=1000
=== out
*250 binary "\*4096{\xfe}"
close code=1000
