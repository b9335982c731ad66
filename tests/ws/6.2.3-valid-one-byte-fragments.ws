=== description
Autobahn 6.2.3: valid UTF-8 text fragmented into one-byte frames, so fragments split code points; validation carries across them.
=== options
closed yes
close 1000
=== in
text more "H"
cont more "e"
cont more "l"
cont more "l"
cont more "o"
cont more "-"
cont more "\xc2"
cont more "\xb5"
cont more "@"
cont more "\xc3"
cont more "\x9f"
cont more "\xc3"
cont more "\xb6"
cont more "\xc3"
cont more "\xa4"
cont more "\xc3"
cont more "\xbc"
cont more "\xc3"
cont more "\xa0"
cont more "\xc3"
cont more "\xa1"
cont more "-"
cont more "U"
cont more "T"
cont more "F"
cont more "-"
cont more "8"
cont more "!"
cont "!"
close code=1000
=== out
text "Hello-\xc2\xb5@\xc3\x9f\xc3\xb6\xc3\xa4\xc3\xbc\xc3\xa0\xc3\xa1-UTF-8!!"
close code=1000
