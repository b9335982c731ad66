=== description
Autobahn 6.4.1: fragment 1 is "κόσμε" (valid), fragment 2 is ED A0 80 (never valid), fragment 3 would follow: fail fast at fragment 2; the third is never read.
=== options
closed yes
close 1007
=== in
text more "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"
cont more "\xed\xa0\x80"
cont "edited"
=== out
close code=1007
=== messages
