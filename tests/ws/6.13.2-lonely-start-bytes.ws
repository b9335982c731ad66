=== description
Autobahn 6.13.2 (lonely start bytes): a text message of the bytes e0 20 e1 20 e2 20 e3 20 e4 20 e5 20 e6 20 e7 20 e8 20 e9 20 ea 20 eb 20 ec 20 ed 20 ee 20, not valid UTF-8: 1007.
=== options
closed yes
close 1007
=== in
text "\xe0 \xe1 \xe2 \xe3 \xe4 \xe5 \xe6 \xe7 \xe8 \xe9 \xea \xeb \xec \xed \xee "
close code=1000
=== out
close code=1007
=== messages
