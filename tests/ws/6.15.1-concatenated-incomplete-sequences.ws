=== description
Autobahn 6.15.1 (concatenated incomplete sequences): a text message of the bytes c0 e0 80 f0 80 80 f8 80 80 80 fc 80 80 80 80 df ef bf f7 bf bf fb bf bf bf fd bf bf bf bf, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xc0\xe0\x80\xf0\x80\x80\xf8\x80\x80\x80\xfc\x80\x80\x80\x80\xdf\xef\xbf\xf7\xbf\xbf\xfb\xbf\xbf\xbf\xfd\xbf\xbf\xbf\xbf"
close code=1000
=== out
close code=1007
=== messages
