=== description
Autobahn 6.7.4 (first sequence of each length): a text message of the bytes f0 90 80 80, valid UTF-8: echoed.
=== options
closed yes
close 1000
=== in
text "\xf0\x90\x80\x80"
close code=1000
=== out
text "\xf0\x90\x80\x80"
close code=1000
