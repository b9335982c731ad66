=== description
Autobahn 9.8.3: 1000 binary messages of 64 bytes back to back.
=== options
closed yes
close 1000
=== in
*1000 binary "\*64{\xfe}"
close code=1000
=== out
*1000 binary "\*64{\xfe}"
close code=1000
