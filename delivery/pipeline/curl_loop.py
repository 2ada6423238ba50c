"""Many HTTP requests at once in one thread: libcurl's multi interface on epoll.

A delivery worker runs one of these instead of a thread per request, so an endpoint
that never answers holds a socket and a curl handle (a few tens of KB), not a thread:
hundreds of requests in flight cost one thread and that memory.

libcurl's socket API (`socket_action`) tells us which sockets to watch and when its next
timeout is due; epoll then waits on exactly those, plus a wake-up pipe other threads
write to when they hand the loop new work. The older `perform`/`select` pair would scan
every transfer on every call and is bounded by select()'s 1,024 descriptors.

Only the thread that calls `run_once` may touch the loop and its handles; `wake` is the
one method other threads may call.
"""

import contextlib
import os
import select
import time

import pycurl

# What a wait does when libcurl has no timer running and nobody wakes it: the caller gets
# control back at least this often (to notice a stop, say).
LONGEST_WAIT_SECONDS = 1.0

_CURL_EVENTS = {
    pycurl.POLL_IN: select.EPOLLIN,
    pycurl.POLL_OUT: select.EPOLLOUT,
    pycurl.POLL_INOUT: select.EPOLLIN | select.EPOLLOUT,
}

Completed = tuple[pycurl.Curl, int, str]  # handle, curl error code (0: done), message


class CurlLoop:
    def __init__(self, *, max_connections: int) -> None:
        self._multi = pycurl.CurlMulti()
        # The size of libcurl's connection cache, which holds busy connections as well as
        # idle ones: past it, the oldest idle connection is closed as a request ends. So
        # it must exceed the requests under way, or keep-alive stops working under load.
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connections)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._epoll = select.epoll()
        self._watched: dict[int, int] = {}
        self._timer_due: float | None = None
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_read, select.EPOLLIN)
        self._handles: set[pycurl.Curl] = set()

    def __len__(self) -> int:
        """Requests under way."""
        return len(self._handles)

    def add(self, handle: pycurl.Curl) -> None:
        """Start a configured request; it is reported by run_once when it ends."""
        self._multi.add_handle(handle)
        self._handles.add(handle)

    def wake(self) -> None:
        """Make a waiting run_once return now (any thread)."""
        # A full pipe has a wake-up pending anyway; a closed loop has nobody to wake.
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"!")

    def run_once(self, timeout: float = LONGEST_WAIT_SECONDS) -> list[Completed]:
        """Wait up to `timeout` (less when a libcurl timer is due sooner, or on wake),
        let libcurl act on what happened, and return the requests that ended."""
        wait = timeout
        if self._timer_due is not None:
            wait = max(0.0, min(wait, self._timer_due - time.monotonic()))
        for fd, events in self._epoll.poll(wait):
            if fd == self._wake_read:
                self._drain_wake_ups()
                continue
            flags = 0
            if events & (select.EPOLLIN | select.EPOLLHUP):
                flags |= pycurl.CSELECT_IN
            if events & select.EPOLLOUT:
                flags |= pycurl.CSELECT_OUT
            if events & select.EPOLLERR:
                flags |= pycurl.CSELECT_ERR
            self._multi.socket_action(fd, flags)
        if self._timer_due is not None and time.monotonic() >= self._timer_due:
            self._timer_due = None
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
        return self._completed()

    def close(self) -> None:
        """Abandon whatever is under way and free the loop's resources (once)."""
        if self._epoll.closed:
            return
        for handle in list(self._handles):
            self._multi.remove_handle(handle)
        self._handles.clear()
        self._multi.close()
        self._epoll.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _completed(self) -> list[Completed]:
        done: list[Completed] = []
        while True:
            queued, succeeded, failed = self._multi.info_read()
            done.extend((handle, 0, "") for handle in succeeded)
            done.extend(failed)
            if not queued:
                break
        for handle, _, _ in done:
            self._multi.remove_handle(handle)
            self._handles.discard(handle)
        return done

    def _drain_wake_ups(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    # libcurl's callbacks: they may only record what it asks for, never call back into it.

    def _on_socket(self, what: int, fd: int, _multi: object, _data: object) -> None:
        if what == pycurl.POLL_REMOVE:
            if self._watched.pop(fd, None) is not None:
                # Closed already, epoll has forgotten it by itself.
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
            return
        events = _CURL_EVENTS[what]
        if self._watched.get(fd) == events:
            return
        try:
            if fd in self._watched:
                self._epoll.modify(fd, events)
            else:
                self._epoll.register(fd, events)
        except FileExistsError:  # a reused descriptor number epoll still had
            self._epoll.modify(fd, events)
        except FileNotFoundError:  # closed and reopened under the same number
            self._epoll.register(fd, events)
        self._watched[fd] = events

    def _on_timer(self, timeout_ms: int) -> None:
        self._timer_due = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
