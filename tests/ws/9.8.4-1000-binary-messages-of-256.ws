=== description
Autobahn 9.8.4: 1000 binary messages of 256 bytes back to back.
=== options
closed yes
close 1000
=== in
*1000 binary "\*256{\xfe}"
close code=1000
=== out
*1000 binary "\*256{\xfe}"
close code=1000
