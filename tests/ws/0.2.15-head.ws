=== description
HEAD cannot upgrade: 400, and as an answer to HEAD it carries no body.
=== request
HEAD /chat HTTP/1.1\r\n
Host: server.example.com\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n
Sec-WebSocket-Version: 13\r\n
\r\n
=== response
HTTP/1.1 400 Bad Request\r\n
Content-Type: text/plain; charset=utf-8\r\n
Content-Length: 16\r\n
Connection: close\r\n
\r\n
