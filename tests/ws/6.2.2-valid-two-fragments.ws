=== description
Autobahn 6.2.2: valid UTF-8 text in two fragments split on a code point boundary.
=== options
closed yes
close 1000
=== in
text more "Hello-\xc2\xb5@\xc3\x9f"
cont "\xc3\xb6\xc3\xa4\xc3\xbc\xc3\xa0\xc3\xa1-UTF-8!!"
close code=1000
=== out
text "Hello-\xc2\xb5@\xc3\x9f\xc3\xb6\xc3\xa4\xc3\xbc\xc3\xa0\xc3\xa1-UTF-8!!"
close code=1000
