=== description
Autobahn 6.5.5 (some valid sequences): a text message of the bytes ce ba e1 bd b9 cf 83 ce bc ce b5, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"
close code=1000
=== out
text "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5"
close code=1000
