import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management.base import BaseCommand


class DemoHandler(BaseHTTPRequestHandler):
    """Answers like a customer's app: /flaky fails half the time, /slow takes 2 s, else 200."""

    counts: dict[str, int] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        with self.lock:
            self.counts[self.path] = self.counts.get(self.path, 0) + 1
        if self.path.startswith("/slow"):
            time.sleep(2)
        status = 503 if self.path.startswith("/flaky") and random.random() < 0.5 else 200
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok" if status == 200 else b"try later")

    def log_message(self, *args) -> None:  # one summary line every few seconds instead
        pass


class Command(BaseCommand):
    help = "Run a small local receiver for the demo endpoints (http://127.0.0.1:PORT/...)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8001)

    def handle(self, *args, port: int, **options) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", port), DemoHandler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.stdout.write(f"demo receiver listening on http://127.0.0.1:{port}/")
        try:
            while True:
                time.sleep(10)
                with DemoHandler.lock:
                    total = sum(DemoHandler.counts.values())
                    busiest = sorted(DemoHandler.counts.items(), key=lambda kv: -kv[1])[:3]
                self.stdout.write(f"demo receiver: {total} requests so far; busiest {busiest}")
        except KeyboardInterrupt:
            server.shutdown()
