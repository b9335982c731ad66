=== description
Autobahn 6.4.4: one text frame declared 100 bytes long whose first 14 bytes already hold ED A0: the connection fails before the frame is complete (the other 86 bytes never come).
=== options
closed yes
close 1007
=== in
text len=100 "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"
=== out
close code=1007
=== messages
