"""A stand-in for an OpenAI-compatible LLM API, for examples/envoy-token-budget.

`POST /v1/chat/completions` with `"stream": true` answers Server-Sent Events: a few content
chunks spread over the stream's length, then a last chunk with the usage,
`"usage": {"prompt_tokens": P, "completion_tokens": C, "total_tokens": T}` (as OpenAI does with
`stream_options.include_usage`), then `data: [DONE]`. The real cost is random between 100 and
the request's `max_tokens` (500 when absent), unless `x-cost` says it; the stream lasts
`x-stream-ms` milliseconds (200 when absent). Every stream it finishes is appended to the file
named by `--log` as a JSON line: the tenant, when it started and its cost.

    python3 upstream.py --port 9000 [--log streams.jsonl]
"""

import argparse
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_path = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        started = time.time()
        length = min(int(self.headers.get("content-length", "0") or 0), 1 << 20)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        most = int(body.get("max_tokens") or 500)
        cost = int(self.headers.get("x-cost") or random.randint(min(100, most), most))
        millis = int(self.headers.get("x-stream-ms") or 200)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunks = 4
        for i in range(chunks):
            self.event({"choices": [{"index": 0, "delta": {"content": f"part {i} "}}]})
            time.sleep(millis / 1000 / chunks)
        prompt = min(cost, 20)
        usage = {"prompt_tokens": prompt, "completion_tokens": cost - prompt, "total_tokens": cost}
        self.event({"choices": [], "usage": usage})
        self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")
        if self.log_path:
            line = json.dumps({"tenant": self.headers.get("x-tenant"), "started": started,
                               "cost": cost}) + "\n"
            with LOCK, open(self.log_path, "a") as f:
                f.write(line)

    # A GET streams the same (curl and the tests send no body).
    do_GET = do_POST

    def event(self, data):
        self.chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--log")
    args = parser.parse_args()
    Handler.log_path = args.log
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
