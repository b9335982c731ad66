=== description
Offers spread over two Sec-WebSocket-Protocol fields (and empty list elements) are one list.
=== options
protocols v2.example,v1.example
=== request
GET /chat HTTP/1.1\r\n
Host: server.example.com\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n
Sec-WebSocket-Version: 13\r\n
Sec-WebSocket-Protocol: , v1.example\r\n
Sec-WebSocket-Protocol: v2.example\r\n
\r\n
=== response
HTTP/1.1 101 Switching Protocols\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n
Sec-WebSocket-Protocol: v2.example\r\n
\r\n
