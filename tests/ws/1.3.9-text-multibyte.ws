=== description
Text with 2-, 3- and 4-byte characters in one frame; echoed unchanged.
=== options
closed yes
close 1000
=== in
text "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"
close code=1000
=== out
text "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"
close code=1000
