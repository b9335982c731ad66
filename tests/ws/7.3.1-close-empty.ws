=== description
Autobahn 7.3.1: a close frame without payload: answered with a close 1000; reported as 1005 (no status received).
=== options
closed yes
close 1005
=== in
close
=== out
close code=1000
