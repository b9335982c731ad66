=== description
Two Sec-WebSocket-Key fields: 400.
=== request
GET /chat HTTP/1.1\r\n
Host: server.example.com\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n
Sec-WebSocket-Version: 13\r\n
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n
\r\n
=== response
HTTP/1.1 400 Bad Request\r\n
Content-Type: text/plain; charset=utf-8\r\n
Content-Length: 16\r\n
Connection: close\r\n
\r\n
400 Bad Request\n
