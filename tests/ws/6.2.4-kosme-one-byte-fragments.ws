=== description
Autobahn 6.2.4: "κόσμε" fragmented into one-byte frames.
=== options
closed yes
close 1000
=== in
text more "\xce"
cont more "\xba"
cont more "\xe1"
cont more "\xbd"
cont more "\xb9"
cont more "\xcf"
cont more "\x83"
cont more "\xce"
cont more "\xbc"
cont more "\xce"
cont "\xb5"
close code=1000
=== out
text "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"
close code=1000
