"""The simulation's receiver: a fast HTTP server in a process of its own that records
when each delivery arrives.

It is an asyncio HTTP/1.1 keep-alive server, not Django and not a thread per
connection, so that it costs the machine far less than the workers it measures. The
path says how to answer and whose delivery it is:

    /ok/<tenant>/<endpoint>      200 at once
    /hang/<tenant>/<endpoint>    never answers; the client's deadline ends the request
    /storm/<tenant>/<endpoint>   after service_ms: 503 while "down" (an outage; or, told
                                 so, with a Retry-After naming the announced recovery,
                                 as a maintenance page would), 200 once it is back
    /fragile/<tenant>/<endpoint> a server of capacity C (the platform is not told it):
                                 with n requests open, this one included, 200 after
                                 service_ms x max(1, n / C), so past C requests at once
                                 answers only slow down; past 2C, 503 at once

Each request is recorded as (webhook-id, path, arrival time, status, retry). `retry` is
1 when the same webhook-id already reached a storm path: the receiver tells a platform's
retry from a first attempt the way a real one could, by the id.

Control requests (the runner's): GET /__stats, GET /__records, POST /__reset,
POST /__down?until=UNIX_TIME[&retry_after=1] (up again at that time),
POST /__capacity?c=N (the fragile endpoint's C from now on). Run with `python -m simulation.receiver SERVICE_MS`;
it prints its port, then serves until killed.
"""

import asyncio
import json
import math
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from subprocess import PIPE, Popen

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
DOWN = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown"
MAINTENANCE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Length: 4\r\n\r\ndown"
)
KINDS = ("ok", "hang", "storm", "storm_retry", "fragile")


@dataclass
class State:
    service_ms: float
    down_until: float = 0.0  # the storm endpoint answers 503 until this time
    retry_after: bool = False  # ...with a Retry-After pointing at that time
    capacity: int = 1  # the fragile endpoint's C: requests it takes at once at full speed
    records: list[tuple[str, str, float, int, int]] = field(default_factory=list)
    seen_storm: set[str] = field(default_factory=set)
    open: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    open_max: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    statuses: dict[int, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.down_until = 0.0
        self.retry_after = False
        self.capacity = 1
        self.records.clear()
        self.seen_storm.clear()
        self.statuses.clear()
        # Open counts belong to live connections; only the maxima start again.
        self.open_max = dict(self.open)

    def stats(self) -> dict:
        return {
            "requests": len(self.records),
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "open": self.open,
            "open_max": self.open_max,
        }


class Protocol(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.holding: str | None = None  # the kind of the request left unanswered, if any

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = buffer[:end].lower()  # header names are case-insensitive
            length = int(_header(head, b"content-length") or 0)
            if len(buffer) < end + 4 + length:
                break
            buffer = buffer[end + 4 + length :]
            self._answer(head)
        self.buffer = buffer

    def _answer(self, head: bytes) -> None:
        state, transport = self.state, self.transport
        assert transport is not None
        method, path = head.split(b" ", 2)[:2]
        if path.startswith(b"/__"):
            transport.write(self._control(method, path.decode()))
            return
        now = time.time()
        event_id = (_header(head, b"webhook-id") or b"").decode().upper()  # ULIDs are upper case
        text = path.decode()
        kind = text.split("/", 2)[1]
        if kind == "hang":
            self._hold("hang")
            state.records.append((event_id, text, now, 0, 0))
            return
        if kind == "fragile":
            self._fragile(event_id, text, now)
            return
        status, retry = 200, 0
        if kind == "storm":
            retry = int(event_id in state.seen_storm)
            state.seen_storm.add(event_id)
            status = 503 if now < state.down_until else 200
        state.statuses[status] = state.statuses.get(status, 0) + 1
        state.records.append((event_id, text, now, status, retry))
        if kind != "storm":
            transport.write(OK)
            return
        reply = OK if status == 200 else DOWN
        if status != 200 and state.retry_after:
            # In whole seconds, rounded up: nothing is due before the recovery.
            reply = MAINTENANCE % math.ceil(state.down_until - now)
        self._hold("storm_retry" if retry else "storm")
        if state.service_ms <= 0:
            self._finish(reply)  # open for an instant, still counted in the maxima
        else:
            asyncio.get_running_loop().call_later(state.service_ms / 1000, self._finish, reply)

    def _fragile(self, event_id: str, path: str, now: float) -> None:
        state = self.state
        assert self.transport is not None
        self._release()  # a request this connection left open before is over
        open_now = state.open["fragile"] + 1
        status = 200 if open_now <= 2 * state.capacity else 503
        state.statuses[status] = state.statuses.get(status, 0) + 1
        state.records.append((event_id, path, now, status, 0))
        if status != 200:
            self.transport.write(DOWN)
            return
        self._hold("fragile")
        delay = state.service_ms / 1000 * max(1.0, open_now / state.capacity)
        asyncio.get_running_loop().call_later(delay, self._finish, OK)

    def _finish(self, reply: bytes) -> None:
        self._release()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)

    def _hold(self, kind: str) -> None:
        self._release()  # a client sends its next request only once it gave up on the last
        self.holding = kind
        self.state.open[kind] += 1
        self.state.open_max[kind] = max(self.state.open_max[kind], self.state.open[kind])
        if kind == "storm_retry":  # a retry is a request to the storm endpoint as well
            self.state.open["storm"] += 1
            self.state.open_max["storm"] = max(
                self.state.open_max["storm"], self.state.open["storm"]
            )

    def _release(self) -> None:
        if self.holding is not None:
            self.state.open[self.holding] -= 1
            if self.holding == "storm_retry":
                self.state.open["storm"] -= 1
            self.holding = None

    def _control(self, method: bytes, path: str) -> bytes:
        state = self.state
        body = b"{}"
        if path == "/__stats":
            body = json.dumps(state.stats()).encode()
        elif path == "/__records":
            body = json.dumps(state.records, separators=(",", ":")).encode()
        elif path == "/__reset":
            state.reset()
        elif path.startswith("/__down?until="):
            query = dict(part.split("=", 1) for part in path.partition("?")[2].split("&"))
            state.down_until = float(query["until"])
            state.retry_after = query.get("retry_after") == "1"
        elif path.startswith("/__capacity?c="):
            state.capacity = max(1, int(path.partition("=")[2]))
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _header(head: bytes, name: bytes) -> bytes | None:
    """A header's value from a lower-cased request head, None if absent."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    stop = head.find(b"\r\n", start)
    return head[start : stop if stop >= 0 else len(head)].strip()


def serve(service_ms: float) -> None:
    # Ctrl-C reaches the whole process group; the runner stops us itself, after the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        state = State(service_ms)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Protocol(state), "127.0.0.1", 0, backlog=2048)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class Receiver:
    """The receiver process, seen from the runner."""

    def __init__(self, service_ms: float) -> None:
        self.process = Popen(
            [sys.executable, "-m", "simulation.receiver", str(service_ms)],
            stdout=PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.base = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def url(self, kind: str, tenant: str, endpoint: str) -> str:
        return f"{self.base}/{kind}/{tenant}/{endpoint}"

    def _call(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(self.base + path, method=method)  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return json.loads(response.read())

    def stats(self) -> dict:
        return self._call("/__stats")  # type: ignore[return-value]

    def records(self) -> list[list]:
        return self._call("/__records")  # type: ignore[return-value]

    def reset(self) -> None:
        self._call("/__reset", "POST")

    def down_until(self, until: float, *, retry_after: bool = False) -> None:
        """The storm endpoint answers 503 until `until` (a Unix time), then 200."""
        self._call(f"/__down?until={until:.3f}&retry_after={int(retry_after)}", "POST")

    def set_capacity(self, capacity: int) -> None:
        """The fragile endpoint takes `capacity` requests at once at full speed from now."""
        self._call(f"/__capacity?c={capacity}", "POST")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


if __name__ == "__main__":
    serve(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
