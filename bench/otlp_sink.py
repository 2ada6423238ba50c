"""A trace collector stand-in on 127.0.0.1 for the benchmarks: it takes OTLP/HTTP
exports, counts them and throws them away, so a traced run pays for making, batching,
encoding and sending its spans, as it would to a real collector."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(size)
        with self.server.lock:
            self.server.exports += 1
            self.server.bytes += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class OtlpSink:
    """Start with `with OtlpSink() as sink:`; `sink.env` turns tracing on in a child."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.lock = threading.Lock()
        self._server.exports = 0
        self._server.bytes = 0
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "OtlpSink":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def env(self) -> dict[str, str]:
        port = self._server.server_address[1]
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
            "OTEL_SERVICE_NAME": "fairhooks-bench",
        }

    @property
    def received(self) -> tuple[int, int]:
        """(exports, bytes) so far."""
        return self._server.exports, self._server.bytes
