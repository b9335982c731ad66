=== description
Autobahn 7.5.1: close 1000 whose reason is not valid UTF-8 (a surrogate): 1007.
=== options
closed yes
close 1007
=== in
close code=1000 "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"
=== out
close code=1007
