=== description
Autobahn 7.3.5: close 1000 with a 123-byte reason (a 125-byte payload, the most allowed): echoed.
=== options
closed yes
close 1000
=== in
close code=1000 "\*123{*}"
=== out
close code=1000
