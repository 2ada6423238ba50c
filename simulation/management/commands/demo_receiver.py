import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management.base import BaseCommand

HANG_SECONDS = 60.0  # longer than any demo endpoint's deadline


class DemoHandler(BaseHTTPRequestHandler):
    """Answers like the demo shops' apps, by the first part of the path (simulation.demo):
    /flaky fails half the time, /broken always fails, /hang never answers in time, else 200."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the worker's connection pool expects

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind = self.path.strip("/").split("/", 1)[0]
        if kind == "hang":
            time.sleep(HANG_SECONDS)
        failing = kind == "broken" or (kind == "flaky" and random.random() < 0.5)
        status, body = (503, b"try later") if failing else (200, b"ok")
        if kind == "broken":
            status, body = 500, b"internal error in the shop's app"
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # `make run` prints one status line instead
        pass


class DemoServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # The worker gives up on /hang at its deadline and closes the connection: the late
        # answer's broken pipe is the demo working, not an error to print.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Command(BaseCommand):
    help = "Run the demo shops' receiver on http://127.0.0.1:PORT/ (see simulation.demo)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8001)

    def handle(self, *args, port: int, **options) -> None:
        server = DemoServer(("127.0.0.1", port), DemoHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            server.shutdown()
