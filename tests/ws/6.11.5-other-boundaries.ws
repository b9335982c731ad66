=== description
Autobahn 6.11.5 (other boundaries): a text message of the bytes f4 90 80 80, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xf4\x90\x80\x80"
close code=1000
=== out
close code=1007
=== messages
