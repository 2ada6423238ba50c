import base64
import hashlib
import hmac
import json
import random
import socket
import time
import uuid
from urllib.parse import urlsplit

import requests
from django.core.management.base import BaseCommand

from webhooks import demo


def shopify_signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


class Command(BaseCommand):
    help = (
        "Post signed Shopify-style demo events to the ingest endpoint: a trickle from the quiet "
        "shops and, every --flood-every seconds, a burst from the loud one."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--url", default=f"http://127.0.0.1:8000/ingest/{demo.DEMO_SOURCE_SLUG}/"
        )
        parser.add_argument("--flood-size", type=int, default=1500)
        parser.add_argument("--flood-every", type=float, default=90.0)
        parser.add_argument(
            "--duration", type=float, default=0, help="Seconds to run; 0 = forever."
        )

    def handle(
        self, *args, url: str, flood_size: int, flood_every: float, duration: float, **options
    ) -> None:
        session = requests.Session()
        session.trust_env = False
        self._wait_for_server(url)
        started = time.monotonic()
        next_flood = started + 10
        while not duration or time.monotonic() - started < duration:
            shop = random.choice(demo.QUIET_TENANTS)
            self._post(session, url, shop)
            if time.monotonic() >= next_flood:
                self.stdout.write(f"demo traffic: {demo.LOUD_TENANT} floods {flood_size} events")
                for _ in range(flood_size):
                    self._post(session, url, demo.LOUD_TENANT)
                next_flood = time.monotonic() + flood_every
            time.sleep(0.3)

    def _wait_for_server(self, url: str, timeout: float = 60.0) -> None:
        """`make run` starts the web server beside us: the first post should not race it."""
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            try:
                socket.create_connection(address, timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stderr.write(f"demo traffic: nothing answers on {address[0]}:{address[1]} yet")

    def _post(self, session: requests.Session, url: str, shop: str) -> None:
        body = json.dumps(
            {"id": random.randint(1, 10**12), "shop": shop, "total": "12.50"}
        ).encode()
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
            time.sleep(1)
