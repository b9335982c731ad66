=== description
Autobahn 5.12 (5.13, 5.14 in pieces): a continuation frame without FIN and nothing to continue: 1002.
=== options
closed yes
close 1002
=== in
cont more "non-continuation payload"
text "Hello, world!"
=== out
close code=1002
=== messages
