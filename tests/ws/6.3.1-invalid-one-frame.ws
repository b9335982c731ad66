=== description
Autobahn 6.3.1: "κόσμε" + ED A0 80 (a UTF-16 surrogate) + "edited" in one frame: 1007.
=== options
closed yes
close 1007
=== in
text "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"
close code=1000
=== out
close code=1007
=== messages
