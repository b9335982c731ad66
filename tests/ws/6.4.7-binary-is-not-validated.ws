=== description
Binary messages carry any bytes: the invalid sequence is echoed.
=== options
closed yes
close 1000
=== in
binary "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"
close code=1000
=== out
binary "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"
close code=1000
