=== description
Autobahn 6.4.3: three fragments cut at byte 12 and 13, so fragment 1 ends in ED (still valid), fragment 2 is A0 (now impossible): fail at fragment 2, then a flood of continuation frames is never read.
=== options
closed yes
close 1007
=== in
text more "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed"
cont more "\xa0"
cont more "\x80edited"
*20 cont more "\*16{*}"
=== out
close code=1007
=== messages
