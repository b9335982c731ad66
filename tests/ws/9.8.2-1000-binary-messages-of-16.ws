=== description
Autobahn 9.8.2: 1000 binary messages of 16 bytes back to back.
=== options
closed yes
close 1000
=== in
*1000 binary "\*16{\xfe}"
close code=1000
=== out
*1000 binary "\*16{\xfe}"
close code=1000
