// Description: the npm `ws` client against examples/c/ws_echo (issue 6): text, binary, empty,
// fragmented (with a ping between fragments and UTF-8 split across them), pipelined and 1 MiB
// messages, each echo checked byte for byte; ping and pong; a close with a code and a reason.
// Usage: node interop.js WS_ECHO [--backend epoll|io_uring] [--path /]   (exit 0 pass, 1 fail)
'use strict';
const { spawn } = require('child_process');
const crypto = require('crypto');
const net = require('net');
const WebSocket = require('ws');

const args = process.argv.slice(2);
const echoBin = args[0];
let backend = null;
let path = '/';
for (let i = 1; i < args.length; i += 2) {
  if (args[i] === '--backend') backend = args[i + 1];
  else if (args[i] === '--path') path = args[i + 1];
  else throw new Error(`unknown option ${args[i]}`);
}
const tag = `ws_interop[${backend || 'default'}]`;
const TIMEOUT_MS = 20000;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function canConnect(port) {
  return new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1');
    c.on('connect', () => { c.destroy(); resolve(true); });
    c.on('error', () => resolve(false));
  });
}

// Starts ws_echo on a free port (another one if that port was taken meanwhile).
async function startServer() {
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const argv = [String(port), '--workers', '1'];
    if (backend) argv.push('--backend', backend);
    const proc = spawn(echoBin, argv, { stdio: ['ignore', 'ignore', 'inherit'] });
    let exited = null;
    proc.on('exit', (code, signal) => { exited = { code, signal }; });
    for (let i = 0; i < 250 && !exited; i++) {
      if (await canConnect(port)) return { proc, port, exited: () => exited };
      await sleep(20);
    }
    if (!exited) {
      proc.kill('SIGKILL');
      throw new Error(`ws_echo did not listen on port ${port} within 5 s`);
    }
    console.error(`${tag}: ws_echo exited (${JSON.stringify(exited)}) before listening; retrying`);
  }
  throw new Error('ws_echo could not be started');
}

// Incoming messages and pongs as queues, so that a check can wait for the next one.
function queues(ws) {
  const q = { message: [], pong: [], waiters: { message: [], pong: [] } };
  const push = (kind, v) => {
    const w = q.waiters[kind].shift();
    if (w) w.resolve(v);
    else q[kind].push(v);
  };
  ws.on('message', (data, isBinary) => push('message', { data, isBinary }));
  ws.on('pong', (data) => push('pong', data));
  q.next = (kind, what) => {
    if (q[kind].length) return Promise.resolve(q[kind].shift());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ${kind} for ${what} within ${TIMEOUT_MS} ms`)),
        TIMEOUT_MS);
      q.waiters[kind].push({ resolve: (v) => { clearTimeout(timer); resolve(v); } });
    });
  };
  return q;
}

function sameBytes(what, got, want) {
  const g = Buffer.isBuffer(got) ? got : Buffer.from(got);
  if (g.length !== want.length) throw new Error(`${what}: ${g.length} bytes echoed, ${want.length} sent`);
  const i = g.findIndex((b, k) => b !== want[k]);
  if (i >= 0) throw new Error(`${what}: echo differs at byte ${i} (${g[i]} != ${want[i]})`);
}

async function expectEcho(q, what, want, binary) {
  const m = await q.next('message', what);
  if (m.isBinary !== binary) throw new Error(`${what}: echoed as ${m.isBinary ? 'binary' : 'text'}`);
  sameBytes(what, m.data, want);
}

function sendFrag(ws, buf, binary, fin) {
  return new Promise((resolve, reject) =>
    ws.send(buf, { binary, fin, compress: false }, (err) => (err ? reject(err) : resolve())));
}

async function run(port) {
  const ws = new WebSocket(`ws://127.0.0.1:${port}${path}`, { perMessageDeflate: false,
    maxPayload: 64 << 20, handshakeTimeout: TIMEOUT_MS });
  const q = queues(ws);
  const closed = new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason })));
  ws.on('error', (e) => console.error(`${tag}: client error: ${e.message}`));
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  const cases = [];
  const pass = (name) => { cases.push(name); console.log(`ok ${cases.length} - ${name}`); };

  const text = 'hello, wörld ✓ 𝄞 — ☃';
  ws.send(text);
  await expectEcho(q, 'text', Buffer.from(text), false);
  pass('text message');

  ws.send('');
  await expectEcho(q, 'empty text', Buffer.alloc(0), false);
  ws.send(Buffer.alloc(0));
  await expectEcho(q, 'empty binary', Buffer.alloc(0), true);
  pass('empty text and binary messages');

  const bin = crypto.randomBytes(1000);
  bin[0] = 0; bin[1] = 0xff;
  ws.send(bin);
  await expectEcho(q, 'binary', bin, true);
  pass('binary message');

  for (const n of [125, 126, 65535, 65536]) {
    const b = crypto.randomBytes(n);
    ws.send(b);
    await expectEcho(q, `binary of ${n} bytes`, b, true);
  }
  pass('length encodings (125, 126, 65535, 65536 bytes)');

  const parts = [crypto.randomBytes(10), crypto.randomBytes(70000), crypto.randomBytes(1)];
  await sendFrag(ws, parts[0], true, false);
  await sendFrag(ws, parts[1], true, false);
  await sendFrag(ws, parts[2], true, true);
  await expectEcho(q, 'fragmented binary', Buffer.concat(parts), true);
  pass('fragmented binary message (3 fragments)');

  // UTF-8 split inside characters across fragments, with a ping between two of them.
  const utf = Buffer.from('añ€𝄞'.repeat(50));
  const cut = [1, 2, 4, 5, 9, utf.length];
  let from = 0;
  for (let i = 0; i < cut.length; i++) {
    await sendFrag(ws, utf.subarray(from, cut[i]), false, i === cut.length - 1);
    if (i === 2) ws.ping(Buffer.from('between fragments'));
    from = cut[i];
  }
  sameBytes('pong between fragments', await q.next('pong', 'ping between fragments'),
    Buffer.from('between fragments'));
  await expectEcho(q, 'fragmented text', utf, false);
  pass('fragmented text split inside characters, ping between fragments');

  const big = crypto.randomBytes(1 << 20);
  ws.send(big);
  await expectEcho(q, '1 MiB binary', big, true);
  const bigText = Buffer.from('0123456789abcdef€𝄞'.repeat(Math.ceil((1 << 20) / 23))).subarray(0, 1 << 20);
  // Cut at a character boundary so that the text is valid UTF-8.
  let end = bigText.length;
  while ((bigText[end - 1] & 0xc0) === 0x80 || bigText[end - 1] >= 0xc0) end--;
  const bigValid = Buffer.from(bigText.subarray(0, end).toString('utf8'));
  ws.send(bigValid.toString('utf8'));
  await expectEcho(q, '1 MiB text', bigValid, false);
  pass(`1 MiB binary and ${bigValid.length}-byte text messages`);

  const many = [];
  for (let i = 0; i < 200; i++) {
    many.push(crypto.randomBytes(1 + (i * 37) % 3000));
    ws.send(many[i]);
  }
  for (let i = 0; i < many.length; i++) await expectEcho(q, `pipelined message ${i}`, many[i], true);
  pass('200 pipelined messages echoed in order');

  ws.ping(Buffer.from('ping payload'));
  sameBytes('pong', await q.next('pong', 'ping'), Buffer.from('ping payload'));
  ws.ping();
  sameBytes('empty pong', await q.next('pong', 'empty ping'), Buffer.alloc(0));
  pass('ping answered by a pong with the same payload');

  ws.close(4000, 'bye ✓');
  const c = await Promise.race([closed, sleep(TIMEOUT_MS).then(() => null)]);
  if (c === null) throw new Error(`close: the connection did not close within ${TIMEOUT_MS} ms`);
  if (c.code !== 4000) throw new Error(`close: the server answered code ${c.code}, not 4000`);
  pass('close 4000 with a reason: echoed code, connection closed');
  return cases.length;
}

(async () => {
  let server;
  try {
    server = await startServer();
    const n = await run(server.port);
    server.proc.kill('SIGTERM');
    for (let i = 0; i < 250 && !server.exited(); i++) await sleep(20);
    const e = server.exited();
    if (!e) throw new Error('ws_echo did not exit within 5 s of SIGTERM');
    if (!(e.code === 0 || e.signal === 'SIGTERM'))
      throw new Error(`ws_echo ended with ${JSON.stringify(e)} after SIGTERM`);
    console.log(`${tag}: ${n} cases passed`);
    process.exit(0);
  } catch (err) {
    console.error(`${tag}: FAIL: ${err.message}`);
    if (server && !server.exited()) server.proc.kill('SIGKILL');
    process.exit(1);
  }
})();
