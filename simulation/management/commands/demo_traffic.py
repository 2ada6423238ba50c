"""The demo's traffic: quiet shops trickle signed webhooks in, and big-shop floods at about
twice what this machine's worker delivers, measured first (so the demo overloads any
machine, fast or slow, and the pacing shows)."""

import base64
import hashlib
import hmac
import json
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from urllib.parse import urlsplit

import requests
from django.core.management.base import BaseCommand, CommandError

from delivery.scheduler import get_scheduler
from simulation import demo

BATCH = 500  # events per publish-API request (its PUBLISH_MAX_BATCH default)
PROBE_EVENTS = 3000
PROBE_SECONDS = 12.0
MIN_CAPACITY = 50.0  # events/s: a floor so that a failed probe still floods something


def shopify_signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


class Command(BaseCommand):
    help = (
        "Post demo events: quiet shops send signed Shopify-style webhooks (--quiet-rate per "
        "second in all); big-shop floods through the publish API at --overload times the "
        "delivery capacity, measured by a short probe unless --capacity is given, for "
        "--flood-seconds out of every --flood-every. The publish token comes from "
        "DEMO_PUBLISH_TOKEN."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--base", default="http://127.0.0.1:8000")
        parser.add_argument("--quiet-rate", type=float, default=4.0)
        parser.add_argument("--overload", type=float, default=2.0)
        parser.add_argument("--capacity", type=float, default=0, help="Skip the probe.")
        parser.add_argument("--flood-seconds", type=float, default=40.0)
        parser.add_argument("--flood-every", type=float, default=100.0)
        parser.add_argument("--duration", type=float, default=0, help="0 = until stopped.")

    def handle(self, *args, base: str, **o) -> None:
        token = os.environ.get("DEMO_PUBLISH_TOKEN", "")
        if not token:
            raise CommandError("DEMO_PUBLISH_TOKEN is not set (make run sets it).")
        self.base = base.rstrip("/")
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.headers["Authorization"] = f"Bearer {token}"
        self._wait_for_server()
        stop = threading.Event()
        quiet = threading.Thread(target=self._quiet_shops, args=(o["quiet_rate"], stop))
        quiet.daemon = True
        quiet.start()
        started = time.monotonic()
        capacity = o["capacity"] or self._probe()
        rate = capacity * o["overload"]
        self.stdout.write(
            f"demo traffic: the worker delivers about {capacity:,.0f}/s here; {demo.LOUD_TENANT} "
            f"floods at {o['overload']:g}x what is delivered (from {rate:,.0f}/s) for "
            f"{o['flood_seconds']:g} s every {o['flood_every']:g} s"
        )
        try:
            while not o["duration"] or time.monotonic() - started < o["duration"]:
                self._flood(rate, o["overload"], o["flood_seconds"])
                time.sleep(max(o["flood_every"] - o["flood_seconds"], 0))
        finally:
            stop.set()

    def _probe(self) -> float:
        """Deliveries per second while a backlog lasts: publish a burst and watch the
        scheduler's delivered counter. A burst that drains before the probe ends is too
        small to tell (publishing overlapped most of it): try one three times bigger."""
        events, capacity = PROBE_EVENTS, MIN_CAPACITY
        for _ in range(3):
            capacity, drained = self._probe_once(events)
            if not drained:
                break
            events *= 3
        return max(MIN_CAPACITY, capacity)

    def _probe_once(self, events: int) -> tuple[float, bool]:
        """The best rate over half-second windows in which a backlog remained: a machine
        still starting (migrations, the first connections) delivers slowly at first."""
        scheduler = get_scheduler()
        started = time.monotonic()
        self._publish(events)
        last = (time.monotonic(), scheduler.counters().get("delivered", 0))
        best, drained = 0.0, False
        while last[0] - started < PROBE_SECONDS and not drained:
            time.sleep(0.5)
            drained = scheduler.snapshot(top_n=1).fresh_depth == 0
            now = (time.monotonic(), scheduler.counters().get("delivered", 0))
            if not drained and now[1] >= last[1]:
                best = max(best, (now[1] - last[1]) / (now[0] - last[0]))
            last = now
        return best, drained

    def _flood(self, rate: float, overload: float, seconds: float) -> None:
        """One-second bursts, as a busy store's platform sends them. The rate follows what
        is delivered: never below `overload` times the deliveries of the last few seconds,
        so a probe that guessed low (a machine still starting) cannot leave it unpaced."""
        self.stdout.write(f"demo traffic: {demo.LOUD_TENANT} floods")
        scheduler = get_scheduler()
        recent: deque[tuple[float, int]] = deque(maxlen=4)
        started = time.monotonic()
        offered = 0
        while time.monotonic() - started < seconds:
            tick = time.monotonic()
            self._publish(int(rate))
            offered += int(rate)
            recent.append((time.monotonic(), scheduler.counters().get("delivered", 0)))
            (then, before), (now, after) = recent[0], recent[-1]
            if now > then and after >= before:  # (a schedule rebuild resets the counter)
                rate = max(rate, overload * (after - before) / (now - then))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        self.stdout.write(
            f"demo traffic: flood over ({offered / seconds:,.0f} events/s offered); "
            f"{demo.LOUD_TENANT} drains at its fair share"
        )

    def _publish(self, count: int) -> None:
        while count > 0:
            size = min(BATCH, count)
            events = [
                {
                    "tenant": demo.LOUD_TENANT,
                    "event_type": "orders/create",
                    "payload": {"id": random.randint(1, 10**12), "total": "12.50"},
                }
                for _ in range(size)
            ]
            try:
                answer = self.session.post(
                    f"{self.base}/api/v1/events", json={"events": events}, timeout=30
                )
                if answer.status_code >= 400:
                    self.stderr.write(f"demo traffic: publish answered {answer.status_code}")
                    time.sleep(1)
            except requests.RequestException as exc:
                self.stderr.write(f"demo traffic: {exc}")
                time.sleep(1)
            count -= size

    def _quiet_shops(self, rate: float, stop: threading.Event) -> None:
        session = requests.Session()
        session.trust_env = False
        url = f"{self.base}/ingest/{demo.DEMO_SOURCE_SLUG}/"
        while not stop.wait(random.expovariate(rate)):
            shop = random.choice(demo.QUIET_TENANTS)
            body = json.dumps({"id": random.randint(1, 10**12), "shop": shop}).encode()
            headers = {
                "Content-Type": "application/json",
                "X-Shopify-Topic": "orders/create",
                "X-Shopify-Shop-Domain": shop,
                "X-Shopify-Event-Id": str(uuid.uuid4()),
                "X-Shopify-Hmac-Sha256": shopify_signature(demo.DEMO_SOURCE_SECRET, body),
            }
            try:
                session.post(url, data=body, headers=headers, timeout=10)
            except requests.RequestException as exc:
                self.stderr.write(f"demo traffic: {exc}")
                stop.wait(1)

    def _wait_for_server(self, timeout: float = 60.0) -> None:
        """`make run` starts the web server beside us: the first post should not race it."""
        parts = urlsplit(self.base)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            try:
                socket.create_connection(address, timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stderr.write(f"demo traffic: nothing answers on {address[0]}:{address[1]} yet")
