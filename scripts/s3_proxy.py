"""A forwarding HTTP proxy in front of a store server, for the object-store tests and the
latency benchmark: it adds a delay to every request, and answers chosen keys with errors.

    s3_proxy.py UPSTREAM_PORT [--delay-ms MS] [--deny SUBSTRING] [--fail-times N --fail SUBSTRING]
                [--peak FILE]

prints `PORT` once it listens, then serves until stdin closes. A request whose path contains
the --deny substring gets 403 Access Denied; the first N requests whose path contains the
--fail substring get 503 Slow Down (a transient error that clients retry). With --peak, FILE
holds the most requests the proxy has had in flight at once.
"""

import argparse
import http.client
import http.server
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("upstream", type=int)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--deny", default=None)
    p.add_argument("--fail", default=None)
    p.add_argument("--fail-times", type=int, default=0)
    p.add_argument("--peak", default=None)
    a = p.parse_args()
    lock = threading.Lock()
    failures = {"left": a.fail_times}
    flight = {"now": 0, "peak": 0}

    def in_flight(change):
        with lock:
            flight["now"] += change
            if flight["now"] > flight["peak"]:
                flight["peak"] = flight["now"]
                if a.peak:
                    with open(a.peak, "w") as f:
                        f.write(str(flight["peak"]))

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, code, text):
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{text}</Code>'
                f"<Message>{text}</Message></Error>"
            ).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def forward(self):
            in_flight(1)
            try:
                self.relay()
            finally:
                in_flight(-1)

        def relay(self):
            if a.delay_ms:
                time.sleep(a.delay_ms / 1000)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if a.deny and a.deny in self.path:
                return self.answer(403, "AccessDenied")
            if a.fail and a.fail in self.path:
                with lock:
                    fail = failures["left"] > 0
                    failures["left"] -= fail
                if fail:
                    return self.answer(503, "SlowDown")
            conn = http.client.HTTPConnection("127.0.0.1", a.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            except OSError:
                # The server behind stopped: a gateway's answer, as a load balancer gives.
                return self.answer(502, "BadGateway")
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            # A HEAD answer states the object's length, not its own (empty) body's.
            length = r.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
