=== description
Beyond Autobahn's list: 1013 is registered with IANA since RFC 6455 (1012 Service Restart, 1013 Try Again Later, 1014 Bad Gateway), so it is accepted and echoed.
=== options
closed yes
close 1013
=== in
close code=1013
=== out
close code=1013
