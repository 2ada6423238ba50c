"""HTTP/1.1 on the wire, for one request at a time on one connected socket.

Only what a webhook POST needs: write a request, read one response's status line,
headers and at most `cap` bytes of body, within a deadline. It is ours rather than
http.client's because http.client parses every response's headers through the `email`
package and reads them line by line through a buffered file: a third of a delivery
worker's CPU in a profile (docs/BENCHMARKS.md). Here a response usually arrives in one
recv() and is split once.

Being strict costs nothing and keeps a pooled connection honest: a response whose
framing is anything but plain (a known Content-Length or complete chunked coding, read
to the end, nothing left over) marks its connection as not reusable, so a misread
response can never leak into the next request's answer.
"""

import re
import socket
import time
from collections.abc import Mapping

MAX_HEAD_BYTES = 64 * 1024  # status line and headers together
_RECV_BYTES = 64 * 1024
_MAX_CHUNK_LINE = 4096
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SET_HERE = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_NO_BODY = frozenset({204, 304})


class ProtocolError(Exception):
    """The response is not HTTP/1.1 we can read safely."""


class ClosedEarly(Exception):
    """The endpoint closed the connection before the response was complete."""


class DeadlineExceeded(Exception):
    """The request's total deadline passed while waiting on the endpoint."""


def encode_request(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """The request as bytes, ready for one send. Raises ValueError for a header that would
    change the request's shape (a newline in a value, a name that is not a token, or one
    of the headers this module sets itself)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or name.lower() in _SET_HERE:
            raise ValueError(f"header name {name!r} is not allowed")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name!r} has a line break or NUL in its value")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    # latin-1, as http.client does: a character outside it raises UnicodeEncodeError.
    return "\r\n".join(lines).encode("latin-1") + body


def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """sendall, but every wait bounded by what is left of the deadline (an endpoint that
    stops reading must not hold the slot past it)."""
    view = memoryview(data)
    while view:
        sock.settimeout(time_left(deadline))
        try:
            sent = sock.send(view)
        except TimeoutError:
            raise DeadlineExceeded from None
        view = view[sent:]


def time_left(deadline: float) -> float:
    """Seconds until `deadline` (a time.monotonic() time); DeadlineExceeded if none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded
    return left


class Response:
    """One response being read: its head first (`read_head`), then its body (`read_body`).

    `status` and `headers` (lower-case names; repeats joined with ", ") are set once the
    head has arrived, so a body that then fails still reports its status. `reusable`
    says the connection may carry another request.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._buffer = b""
        self.status: int | None = None
        self.version = ""
        self.headers: dict[str, str] = {}
        self.body = b""
        self.reusable = False
        self._chunks: list[bytes] = []  # a chunked body's data so far

    def _fill(self) -> bool:
        """Append what arrives next to the buffer; False at end of stream."""
        self._sock.settimeout(time_left(self._deadline))
        try:
            data = self._sock.recv(_RECV_BYTES)
        except TimeoutError:
            raise DeadlineExceeded from None
        if not data:
            return False
        self._buffer += data
        return True

    def read_head(self) -> None:
        """Status line and headers, skipping interim (1xx) responses."""
        while True:
            self._read_one_head()
            if self.status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols")
            if self.status >= 200:
                return

    def _read_one_head(self) -> None:
        while True:
            end, separator = self._buffer.find(b"\r\n\r\n"), 4
            if end < 0:
                end, separator = self._buffer.find(b"\n\n"), 2
            if end >= 0:
                break
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise ProtocolError("response headers too large")
            if not self._fill():
                if self._buffer:
                    raise ClosedEarly("the endpoint closed the connection mid-response")
                raise ClosedEarly("the endpoint closed the connection without a response")
        if end > MAX_HEAD_BYTES:
            raise ProtocolError("response headers too large")
        head, self._buffer = self._buffer[:end], self._buffer[end + separator :]
        lines = head.decode("latin-1").split("\n")
        parts = lines[0].rstrip("\r").split(" ", 2)
        if (
            len(parts) < 2
            or not parts[0].startswith("HTTP/1.")
            or len(parts[1]) != 3
            or not (parts[1].isascii() and parts[1].isdigit())
        ):
            raise ProtocolError(f"malformed status line {lines[0][:40]!r}")
        headers: dict[str, str] = {}
        name = ""
        for raw in lines[1:]:
            line = raw.rstrip("\r")
            if line[:1] in (" ", "\t") and name:  # obsolete line folding: part of the last
                headers[name] += " " + line.strip()
                continue
            name, colon, value = line.partition(":")
            name = name.lower()
            if not colon or not _TOKEN.fullmatch(name):
                raise ProtocolError(f"malformed header line {line[:40]!r}")
            value = value.strip(" \t")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        # Set only once the whole head parsed: a status is reported only if it is sound.
        self.version, self.status, self.headers = parts[0], int(parts[1]), headers

    def read_body(self, cap: int) -> None:
        """At most `cap` bytes of the body into `body`. Whatever lies past the cap is
        never waited for: the connection is then not reusable, and closed by the caller.
        If reading fails, `body` keeps what had arrived."""
        try:
            self._read_body(cap)
        except BaseException:
            self.reusable = False
            self.body = b"".join(self._chunks) if self._chunks else self._buffer[:cap]
            raise

    def _read_body(self, cap: int) -> None:
        if self.status in _NO_BODY:
            self.reusable = self._keep_alive()
            return
        coding = self.headers.get("transfer-encoding")
        if coding is not None:
            if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                self._read_until_close(cap)  # any other final coding: the close ends it
                return
            self._read_chunked(cap)
            # Both framings at once is a smuggling pattern: never reuse such a connection.
            self.reusable = "content-length" not in self.headers and self._keep_alive()
            return
        length = self.headers.get("content-length")
        if length is None:
            self._read_until_close(cap)
            return
        values = {value.strip() for value in length.split(",")}
        if len(values) != 1 or not ((size := values.pop()).isascii() and size.isdigit()):
            raise ProtocolError(f"invalid Content-Length {length[:40]!r}")
        self._read_sized(int(size), cap)

    def _keep_alive(self) -> bool:
        return (
            self.version == "HTTP/1.1"
            and "close" not in self.headers.get("connection", "").lower()
            and not self._buffer  # anything extra is unexplained: do not build on it
        )

    def _read_sized(self, size: int, cap: int) -> None:
        wanted = min(size, cap)
        while len(self._buffer) < wanted:
            if not self._fill():
                raise ClosedEarly("the endpoint closed the connection mid-body")
        self.body, self._buffer = self._buffer[:wanted], self._buffer[wanted:]
        self.reusable = size <= cap and self._keep_alive()

    def _read_until_close(self, cap: int) -> None:
        while len(self._buffer) < cap:
            if not self._fill():
                break
        self.body, self._buffer = self._buffer[:cap], b""

    def _read_chunked(self, cap: int) -> None:
        kept = self._chunks
        room = cap
        while size := self._chunk_size():
            # The chunk's data and its line break, or only what fits under the cap.
            while len(self._buffer) < (size + 2 if size <= room else room):
                if not self._fill():
                    raise ClosedEarly("the endpoint closed the connection mid-body")
            if size > room:
                kept.append(self._buffer[:room])
                self.body = b"".join(kept)
                return  # cut at the cap: not reusable
            if self._buffer[size : size + 2] == b"\r\n":
                end = size + 2
            elif self._buffer[size : size + 1] == b"\n":
                end = size + 1
            else:
                raise ProtocolError("chunk data not followed by a line break")
            kept.append(self._buffer[:size])
            room -= size
            self._buffer = self._buffer[end:]
        while self._line():  # trailer fields, up to the empty line: read and ignored
            pass
        self.body = b"".join(kept)

    def _chunk_size(self) -> int:
        line = self._line().split(b";", 1)[0].strip()
        if not line or len(line) > 16 or line.strip(b"0123456789abcdefABCDEF"):
            raise ProtocolError(f"malformed chunk size {line[:20]!r}")
        return int(line, 16)

    def _line(self) -> bytes:
        """One line (without its line break) from the buffer, reading more as needed."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > _MAX_CHUNK_LINE:
                raise ProtocolError("chunk line too long")
            if not self._fill():
                raise ClosedEarly("the endpoint closed the connection mid-body")
        line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
        return line.rstrip(b"\r")
