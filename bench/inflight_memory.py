"""Memory per request in flight: N POSTs held open by an endpoint that never answers.

    .venv/bin/python bench/inflight_memory.py [--requests 1000]

One process, the worker's own parts: Transport exchanges driven by a CurlLoop, as the
delivery engine drives them. The endpoint (a thread here, accepting and reading, never
answering) holds every request open; the resident set size is read before and while
they hang, and the difference divided by N is what one hung request costs a worker.
For comparison, the same N requests as threads (the engine before the loop: one thread
per slot, each blocked in its own request) are measured in a child process.
"""

import argparse
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def silent_endpoint() -> tuple[socket.socket, threading.Thread]:
    """A listener that accepts and reads everything, and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)

    def serve() -> None:
        while True:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        return
                    conn.setblocking(False)
                    selector.register(conn, selectors.EVENT_READ)
                else:
                    try:
                        if not key.fileobj.recv(65536):
                            selector.unregister(key.fileobj)
                            key.fileobj.close()
                    except OSError:
                        selector.unregister(key.fileobj)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def held_by_the_loop(url: str, count: int) -> int:
    from delivery.pipeline.curl_loop import CurlLoop
    from delivery.pipeline.transport import Transport

    transport = Transport(allow_private=True, max_idle_handles=count)
    loop = CurlLoop(max_connections=count + 64)
    body = b'{"type": "order.created", "id": 7, "pad": "' + b"x" * 400 + b'"}'
    headers = {"Content-Type": "application/json", "webhook-id": "msg_1"}
    before = rss_kib()
    for _ in range(count):
        exchange = transport.exchange(
            url, body, headers, connect_timeout=5, total_timeout=60, response_cap_bytes=20_000
        )
        loop.add(exchange.handle)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # every request connected and sent
        loop.run_once(0.05)
    during = rss_kib()
    assert len(loop) == count, len(loop)
    return during - before


def held_by_threads(url: str, count: int) -> int:
    """In a child: `count` threads each blocked in one request (the old engine's shape)."""
    code = f"""
import sys, threading, time
sys.path.insert(0, {str(ROOT)!r})
from bench.inflight_memory import rss_kib
from delivery.pipeline.transport import Transport
transport = Transport(allow_private=True, max_idle_handles={count})
threading.stack_size(0)
before = rss_kib()
for _ in range({count}):
    threading.Thread(target=transport.post, args=({url!r}, b"{{}}", {{}}), daemon=True,
        kwargs=dict(connect_timeout=5, total_timeout=60, response_cap_bytes=20000)).start()
time.sleep(5)
print(rss_kib() - before)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    opts = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * opts.requests + 256), hard))
    listener, _ = silent_endpoint()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    loop_kib = held_by_the_loop(url, opts.requests)
    thread_kib = held_by_threads(url, opts.requests)
    n = opts.requests
    print(f"{n} requests held open by a silent endpoint")
    print(
        f"  one CurlLoop thread : {loop_kib / 1024:7.1f} MiB, {loop_kib / n:6.1f} KiB per request"
    )
    print(
        f"  a thread per request: {thread_kib / 1024:7.1f} MiB, {thread_kib / n:6.1f} KiB per request"
    )


if __name__ == "__main__":
    main()
