=== description
The client offers "chat, superchat"; the server prefers superchat: superchat is chosen (the server's order decides).
=== options
protocols superchat,chat
=== request
GET /chat HTTP/1.1\r\n
Host: server.example.com\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n
Sec-WebSocket-Version: 13\r\n
Sec-WebSocket-Protocol: chat, superchat\r\n
\r\n
=== response
HTTP/1.1 101 Switching Protocols\r\n
Upgrade: websocket\r\n
Connection: Upgrade\r\n
Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n
Sec-WebSocket-Protocol: superchat\r\n
\r\n
