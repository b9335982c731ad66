=== description
Autobahn 9.8.1: 1000 binary messages of 0 bytes back to back.
=== options
closed yes
close 1000
=== in
*1000 binary "\*0{\xfe}"
close code=1000
=== out
*1000 binary "\*0{\xfe}"
close code=1000
