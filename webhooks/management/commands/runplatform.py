import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from webhooks import demo


class Command(BaseCommand):
    help = (
        "Run the whole platform for development (what `make run` does): migrate, seed demo data, "
        "then start the web server, a delivery worker, the demo receiver and demo traffic. "
        "Ctrl-C stops everything it started, including the embedded Redis."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--receiver-port", type=int, default=8001)
        parser.add_argument("--no-traffic", action="store_true", help="Do not post demo events.")

    def handle(self, *args, port: int, receiver_port: int, no_traffic: bool, **options) -> None:
        call_command("migrate", verbosity=0)
        creds = demo.seed(f"http://127.0.0.1:{receiver_port}")
        env = {
            **os.environ,
            "REDIS_URL": settings.REDIS_URL,
            "DEBUG": os.environ.get("DEBUG", "true"),
            # The demo delivers to 127.0.0.1; production keeps private addresses refused.
            "ALLOW_PRIVATE_DESTINATIONS": os.environ.get("ALLOW_PRIVATE_DESTINATIONS", "true"),
        }
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        commands = {
            "web": [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
            "worker": [*manage, "rqworker", "default", "maintenance"],
            "receiver": [*manage, "demo_receiver", "--port", str(receiver_port)],
        }
        if not no_traffic:
            commands["traffic"] = [
                *manage,
                "demo_traffic",
                "--url",
                f"http://127.0.0.1:{port}/ingest/{demo.DEMO_SOURCE_SLUG}/",
            ]
        children = {name: subprocess.Popen(cmd, env=env) for name, cmd in commands.items()}
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(
            self.style.SUCCESS("\nThe platform is running:\n")
            + f"  admin           {base}/admin/   (user {creds['admin_user']}, password {creds['admin_password']})\n"
            + f"  RQ dashboard    {base}/admin/django-rq/\n"
            + f"  metrics         {base}/metrics\n"
            + f"  ingest          POST {base}/ingest/{demo.DEMO_SOURCE_SLUG}/ (Shopify-signed, secret {demo.DEMO_SOURCE_SECRET!r})\n"
            + f"  demo receiver   http://127.0.0.1:{receiver_port}/\n"
            + f"  redis           {settings.REDIS_URL}{' (embedded)' if settings.EMBEDDED_REDIS else ''}\n"
            + "Press Ctrl-C to stop.\n"
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            while all(child.poll() is None for child in children.values()):
                time.sleep(0.5)
            dead = [name for name, child in children.items() if child.poll() is not None]
            self.stderr.write(f"{', '.join(dead)} exited; stopping the rest.")
        except KeyboardInterrupt:
            self.stdout.write("\nStopping...")
        finally:
            self._stop(children)

    def _stop(self, children: dict[str, subprocess.Popen]) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 40  # the worker finishes in-flight deliveries first
        for child in children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        # The embedded Redis, if this command's process started it, is stopped by
        # manage.py (project.launch) as it exits.
