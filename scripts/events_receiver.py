#!/usr/bin/env python3
"""A receiver of flashgate's order and deal events that verifies every delivery with the
Standard Webhooks reference library (PyPI `standardwebhooks`, pinned in scripts/services.sh).

    python3 scripts/events_receiver.py --port 9000 --secret whsec_...

Each delivery is checked against every secret it was given (a rotation's old and new
ones), and appended as one JSON line to --log (or stdout): its webhook-id, which secrets
verified it, and the event. A delivery no secret verifies is answered 401 and logged with
"verified_by": []. The tests steer it over HTTP:

    POST /control   {"mode": "ok" | "fail" | "hang", "secrets": [...], "retry_after": N,
                     "delay_ms": N}
    GET  /received  every delivery so far, as a JSON array
    GET  /refused   the webhook-id of every delivery answered 500 so far, as a JSON array

"fail" answers 500 (with Retry-After when set), "hang" never answers; "delay_ms" holds
each answer that long after logging the delivery (a sender killed meanwhile sends it again). The first line on
stdout is "listening <port>".
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

STATE = {"mode": "ok", "secrets": [], "retry_after": None, "delay_ms": 0}
RECEIVED = []
REFUSED = []
LOCK = threading.Lock()


def verified_by(body, headers):
    """Indices of the secrets whose verification by the reference library passed."""
    passed = []
    for index, secret in enumerate(STATE["secrets"]):
        try:
            Webhook(secret).verify(body, headers)
            passed.append(index)
        except WebhookVerificationError:
            pass
    return passed


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        return self.rfile.read(int(self.headers.get("content-length", "0")))

    def do_GET(self):
        lists = {"/received": RECEIVED, "/refused": REFUSED}
        if self.path not in lists:
            return self.reply(404)
        with LOCK:
            answer = json.dumps(lists[self.path]).encode()
        self.reply(200, answer, [("content-type", "application/json")])

    def do_POST(self):
        body = self.body()
        if self.path == "/control":
            with LOCK:
                STATE.update(json.loads(body))
            return self.reply(204)
        mode = STATE["mode"]
        if mode == "hang":
            time.sleep(3600)
            return
        if mode == "fail":
            with LOCK:
                REFUSED.append(self.headers.get("webhook-id"))
            headers = []
            if STATE["retry_after"] is not None:
                headers.append(("retry-after", str(STATE["retry_after"])))
            return self.reply(500, b"failing on purpose", headers)
        headers = {name.lower(): value for name, value in self.headers.items()}
        passed = verified_by(body, headers)
        entry = {
            "webhook_id": headers.get("webhook-id"),
            "webhook_timestamp": headers.get("webhook-timestamp"),
            "signatures": len(headers.get("webhook-signature", "").split(" ")),
            "verified_by": passed,
            "received_at": time.time(),
            "event": json.loads(body) if passed else None,
        }
        with LOCK:
            RECEIVED.append(entry)
            print(json.dumps(entry), file=LOG, flush=True)
        if STATE["delay_ms"]:
            time.sleep(STATE["delay_ms"] / 1000)
        self.reply(204 if passed else 401)


def main():
    global LOG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--secret", action="append", default=[])
    parser.add_argument("--log", default="-")
    args = parser.parse_args()
    STATE["secrets"] = args.secret
    LOG = sys.stdout if args.log == "-" else open(args.log, "a", encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
