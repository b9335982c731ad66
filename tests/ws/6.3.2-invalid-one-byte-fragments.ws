=== description
Autobahn 6.3.2: the same invalid text in one-byte fragments: 1007 at the fragment holding A0, later fragments unread.
=== options
closed yes
close 1007
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
cont more "\xb5"
cont more "\xed"
cont more "\xa0"
cont more "\x80"
cont more "e"
cont more "d"
cont more "i"
cont more "t"
cont more "e"
cont "d"
=== out
close code=1007
=== messages
