=== description
Autobahn 6.11.3 (other boundaries): a text message of the bytes ef bf bd, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xef\xbf\xbd"
close code=1000
=== out
text "\xef\xbf\xbd"
close code=1000
