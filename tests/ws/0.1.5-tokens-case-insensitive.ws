=== description
Upgrade and Connection are token lists compared case-insensitively; Connection may list other tokens.
=== request
GET /chat HTTP/1.1\r\n
Host: h\r\n
UPGRADE: WebSocket\r\n
connection: keep-alive, UPGRADE\r\n
sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n
sec-websocket-version: 13\r\n
\r\n
=== response
HTTP/1.1 101 Switching Protocols\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n
\r\n
