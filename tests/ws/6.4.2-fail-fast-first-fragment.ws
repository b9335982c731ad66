=== description
Autobahn 6.4.2: fragment 1 already ends in ED A0: fail at fragment 1.
=== options
closed yes
close 1007
=== in
text more "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0"
cont more "\x80"
cont "edited"
=== out
close code=1007
=== messages
