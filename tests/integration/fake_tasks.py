"""A fake Jackdaw task server for testing workers' retries (not a test itself).

    python3 fake_tasks.py PORT_FILE LOG_FILE COMMAND T1_ARGS OTHER_ARGS

Listens on a free loopback port (written to PORT_FILE) and logs every task
call to LOG_FILE as "PATH STATUS BODY" (claims as "claim ID"). A claim with
lease_ms 12000 gets t1 (args T1_ARGS), then t2; one with lease_ms 2000 gets
t3; any other claim waits 1 s and gets none. t1's first two heartbeats and
first three completes answer 503 with Retry-After: 1 (as a cluster node does
while a task's owner does not answer), t2's complete answers 409
lease_lost, t3's complete always 503; anything else 200. Stops by itself
after 90 s.
"""
import http.server
import json
import sys
import threading
import time

log = open(sys.argv[2], "a", buffering=1)
cmd, t1_args, args = sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
tasks = {12000: [("t1", t1_args), ("t2", args)], 2000: [("t3", args)]}
# path -> answers, taken in turn; the last one stays
plan = {"/v1/tasks/t1/heartbeat": [503, 503, 200], "/v1/tasks/t1/complete": [503, 503, 503, 200],
        "/v1/tasks/t2/complete": [409], "/v1/tasks/t3/complete": [503]}
lock = threading.Lock()


class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, st, body):
        b = json.dumps(body).encode()
        self.send_response(st)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        if st == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(b)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_PUT(self):  # PUT /v1/commands/NAME
        self.body()
        self.answer(200, {"name": cmd, "kind": "remote"})

    def do_POST(self):
        body = self.body()
        if self.path == "/v1/tasks/claim":
            with lock:
                q = tasks.get(json.loads(body).get("lease_ms"), [])
                t = q.pop(0) if q else None
            if not t:
                time.sleep(1)
                return self.answer(200, {"tasks": []})
            log.write("claim %s\n" % t[0])
            return self.answer(200, {"tasks": [{"id": t[0], "command": cmd, "args": t[1],
                                                "job_id": "1", "tag": 1, "attempt": 1,
                                                "idempotency_key": "1:1"}]})
        with lock:
            seq = plan.get(self.path, [200])
            st = seq.pop(0) if len(seq) > 1 else seq[0]
        log.write("%s %d %s\n" % (self.path, st, body.decode()))
        self.answer(st, {"status": st, "reason": "lease_lost"} if st == 409 else {"status": st})


s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(s.server_address[1]))
threading.Timer(90, s.shutdown).start()
s.serve_forever()
