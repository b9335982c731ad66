=== description
Autobahn 6.11.1 (other boundaries): a text message of the bytes ed 9f bf, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xed\x9f\xbf"
close code=1000
=== out
text "\xed\x9f\xbf"
close code=1000
