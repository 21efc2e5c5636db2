// The slow OpenAI-format upstream of bench/streams.py, in Node.js.
//
//   node bench/slow_upstream.mjs --port P [--cert F --key F] [--chunks 15] [--interval 2]
//                                [--backlog 4096]
//
// The same wire format and body controls as tests/fakes/slow_upstream.py
// (chat completions; `fake_chunks`, `fake_delay`; `/mode/drop/` closes the
// stream after its first event): with --cert/--key it serves HTTPS and
// HTTP/2 by ALPN (100 concurrent streams a connection, each event one DATA
// frame), else plain HTTP/1.1 keep-alive with chunked streams.
//
// Why a second fake: the Python one speaks HTTP/2 through the pure-Python h2
// package, and at 10,000 streams it spent about 100 us of CPU a chunk, 0.7 of
// a core on this 2-core machine, and its own loop answered a plain call
// with a p99 of 31 ms (measured beside the relay, 2026-11-25), which is most
// of the 50 ms the bench holds the relay to.  Node's http2 is nghttp2, as
// vendors' front ends are.  The tests keep the Python fake (it runs in-process
// and records what it saw); the bench can still run it (--fake python).
import fs from "node:fs";
import http from "node:http";
import http2 from "node:http2";

const args = {};
for (let i = 2; i < process.argv.length; i += 2) {
  args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
}
const PORT = Number(args.port);
const CHUNKS = Number(args.chunks ?? 15);
const INTERVAL = Number(args.interval ?? 2);
const USAGE_PROMPT = 10;
let requests = 0;

function sse(doc) {
  return "data: " + JSON.stringify(doc) + "\n\n";
}

class Answer {
  constructor(path, raw) {
    requests += 1;
    let body = {};
    try {
      body = JSON.parse(raw || "{}") || {};
    } catch {
      body = {};
    }
    this.model = body.model ?? "";
    this.cid = `chatcmpl-slow${requests}`;
    const n = Number(body.fake_chunks ?? CHUNKS);
    const usage = {prompt_tokens: USAGE_PROMPT, completion_tokens: n,
                   total_tokens: USAGE_PROMPT + n, prompt_tokens_details: {cached_tokens: 0}};
    this.plain = null;
    if (!body.stream) {
      this.plain = JSON.stringify({
        id: this.cid, object: "chat.completion", created: Math.floor(Date.now() / 1000),
        model: this.model, choices: [{index: 0, finish_reason: "stop", message: {
          role: "assistant", content: "Hello from the slow upstream."}}],
        usage: {...usage, completion_tokens: 1, total_tokens: USAGE_PROMPT + 1}});
    }
    this.i = 0;
    this.n = n;
    this.usage = body.stream_options?.include_usage ? usage : null;
    this.delay = 1000 * Number(body.fake_delay ?? INTERVAL);
    this.drop = path.includes("/mode/drop/");
  }

  chunk(delta, finish = null) {
    return sse({id: this.cid, object: "chat.completion.chunk",
                created: Math.floor(Date.now() / 1000), model: this.model,
                choices: [{index: 0, delta, finish_reason: finish}]});
  }

  // The next piece of the stream, and whether it is the last.
  next() {
    const i = this.i++;
    if (i === 0) return [this.chunk({role: "assistant", content: ""}), false];
    let out = this.chunk({content: `piece ${i} `});
    if (i < this.n) return [out, false];
    out += this.chunk({}, "stop");
    if (this.usage) {
      out += sse({id: this.cid, object: "chat.completion.chunk",
                  created: Math.floor(Date.now() / 1000), model: this.model, choices: [],
                  usage: this.usage});
    }
    return [out + "data: [DONE]\n\n", true];
  }
}

function handle(req, res) {
  const parts = [];
  req.on("data", (d) => parts.push(d));
  req.on("end", () => {
    const a = new Answer(req.url || "/", Buffer.concat(parts).toString());
    if (a.plain !== null) {
      res.writeHead(200, {"content-type": "application/json",
                          "content-length": Buffer.byteLength(a.plain)});
      res.end(a.plain);
      return;
    }
    res.writeHead(200, {"content-type": "text/event-stream", "cache-control": "no-cache"});
    let timer = null;
    const send = () => {
      timer = null;
      if (res.destroyed || res.writableEnded) return;
      const [data, last] = a.next();
      if (last) {
        res.end(data);
        return;
      }
      if (a.drop) {
        // Once the event is out: HTTP/2 resets the stream, HTTP/1.1 closes
        // the connection.
        res.write(data, () => {
          if (req.stream) req.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
          else res.socket?.destroy();
        });
        return;
      }
      res.write(data);
      timer = setTimeout(send, a.delay);
    };
    res.on("close", () => {
      if (timer !== null) clearTimeout(timer);
    });
    send();
  });
}

let server;
if (args.cert) {
  server = http2.createSecureServer({
    key: fs.readFileSync(args.key), cert: fs.readFileSync(args.cert), allowHTTP1: true,
    settings: {maxConcurrentStreams: 100}}, handle);
} else {
  server = http.createServer({keepAliveTimeout: 600_000}, handle);
}
// Errors on one connection (a client that resets) are that connection's.
server.on("sessionError", () => {});
server.on("clientError", (err, socket) => socket.destroy());
// The listen backlog: Node's default is 511, nginx's 511, uvicorn's 2048.
const BACKLOG = Number(args.backlog ?? 4096);
server.listen({port: PORT, host: "127.0.0.1", backlog: BACKLOG}, () => {
  console.log(`slow upstream on 127.0.0.1:${PORT}`);
});
process.on("SIGTERM", () => process.exit(0));
process.on("SIGINT", () => process.exit(0));
