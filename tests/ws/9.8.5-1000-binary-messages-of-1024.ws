=== description
Autobahn 9.8.5: 1000 binary messages of 1024 bytes back to back.
=== options
closed yes
close 1000
=== in
*1000 binary "\*1024{\xfe}"
close code=1000
=== out
*1000 binary "\*1024{\xfe}"
close code=1000
