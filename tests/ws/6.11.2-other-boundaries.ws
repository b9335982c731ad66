=== description
Autobahn 6.11.2 (other boundaries): a text message of the bytes ee 80 80, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xee\x80\x80"
close code=1000
=== out
text "\xee\x80\x80"
close code=1000
