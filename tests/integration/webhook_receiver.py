#!/usr/bin/env python3
"""A webhook receiver for test_webhooks.sh and test_trace.sh: verifies Jackdaw-Signature
(t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>) and logs one
JSON line per request. /flaky answers 500 to its first request, /bad 400,
anything else 200. Usage: webhook_receiver.py SECRET PORTFILE LOGFILE"""
import hashlib
import hmac
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET, PORTFILE, LOGFILE = sys.argv[1].encode(), sys.argv[2], sys.argv[3]
seen = {}


def verify(header, body):
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t, v1 = parts["t"], parts["v1"]
    except (KeyError, ValueError, AttributeError):
        return False
    want = hmac.new(SECRET, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, v1) and abs(time.time() - int(t)) < 300


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        n = seen.get(self.path, 0) + 1
        seen[self.path] = n
        status = 500 if self.path == "/flaky" and n == 1 else 400 if self.path == "/bad" else 200
        doc = json.loads(body) if body else {}
        with open(LOGFILE, "a") as f:
            f.write(json.dumps({
                "path": self.path, "n": n, "status": status,
                "sig_ok": verify(self.headers.get("Jackdaw-Signature"), body),
                "event": self.headers.get("Jackdaw-Event"),
                "job_id": self.headers.get("Jackdaw-Job-Id"),
                "body_event": doc.get("event"), "body_job": doc.get("job", {}).get("id"),
                "ctype": self.headers.get("Content-Type"),
                "traceparent": self.headers.get("traceparent")}) + "\n")
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
with open(PORTFILE, "w") as f:
    f.write(str(server.server_address[1]))
server.timeout = 1
deadline = time.time() + 90  # never outlive the test by long
while time.time() < deadline:
    server.handle_request()
