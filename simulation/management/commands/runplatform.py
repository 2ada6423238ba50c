import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from core.env import env_bool
from delivery.scheduler import EndpointRow, get_scheduler
from delivery.upkeep import maintenance
from simulation import demo
from tenants.models import Endpoint, Tenant

STATUS_EVERY_SECONDS = 5.0
# Short retries so that a retry, and a dead letter to replay, show within a minute.
DEMO_RETRY_SCHEDULE = "2,4,8,16"
DEMO_CONCURRENCY = "64"
# charlie's broken endpoint fails about twice a second: a new event each second, and its
# retries at the pace of the endpoint's retry budget (one a second while nothing is
# accepted). At the default of 100 it would be disabled within a minute, a race with its
# first dead letters; at 400 the dead letters come first (~30 s) and the automatic
# disable after ~3.5 min.
DEMO_DISABLE_AFTER_FAILURES = "400"
RQ_REPEAT_SECONDS = 1.1


class Command(BaseCommand):
    help = (
        "Run the whole platform for development (what `make run` does): migrate, seed demo "
        "data, then start the web server, a delivery worker, the demo receiver and demo "
        "traffic, and print a status line every few seconds. Ctrl-C stops everything it "
        "started, including the embedded Redis."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--receiver-port", type=int, default=8001)
        parser.add_argument("--no-traffic", action="store_true", help="Do not post demo events.")

    def handle(self, *args, port: int, receiver_port: int, no_traffic: bool, **options) -> None:
        call_command("migrate", verbosity=0)
        logins = demo.seed(f"http://127.0.0.1:{receiver_port}")
        if get_scheduler().epoch() is None:
            # A new Redis (the embedded one starts empty): rebuild the schedule from the
            # database now, before any traffic, rather than at the first sweep.
            maintenance.rebuild_schedule()
        env = {
            **os.environ,
            "REDIS_URL": settings.REDIS_URL,
            "DEBUG": os.environ.get("DEBUG", "true"),
            # Production asks operators for a second factor; the demo signs in by password.
            "ADMIN_REQUIRE_2FA": os.environ.get("ADMIN_REQUIRE_2FA", "false"),
            # The demo delivers to 127.0.0.1; production keeps private addresses refused.
            "ALLOW_PRIVATE_DESTINATIONS": os.environ.get("ALLOW_PRIVATE_DESTINATIONS", "true"),
            # A readable terminal: warnings and errors only, no line per request.
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
            "RETRY_SCHEDULE_SECONDS": os.environ.get("RETRY_SCHEDULE_SECONDS", DEMO_RETRY_SCHEDULE),
            "ENDPOINT_DISABLE_AFTER_FAILURES": os.environ.get(
                "ENDPOINT_DISABLE_AFTER_FAILURES", DEMO_DISABLE_AFTER_FAILURES
            ),
            # Fewer slots than big-shop's cap: the worker is what the flood outgrows.
            "DELIVERY_CONCURRENCY": os.environ.get("DELIVERY_CONCURRENCY", DEMO_CONCURRENCY),
            "DEMO_PUBLISH_TOKEN": demo.issue_token(),
        }
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        base = f"http://127.0.0.1:{port}"
        commands = {
            "web": [*manage, "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
            "worker": [*manage, "rqworker", "--verbosity", "0", "default", "maintenance"],
            "receiver": [*manage, "demo_receiver", "--port", str(receiver_port)],
        }
        if not no_traffic:
            commands["traffic"] = [*manage, "demo_traffic", "--base", base]
        # Each child in a process group of its own: Ctrl-C reaches this command alone, which
        # then stops them in order (the worker finishing its in-flight requests).
        children = {
            name: subprocess.Popen(cmd, env=env, process_group=0) for name, cmd in commands.items()
        }
        self._banner(base, receiver_port, logins)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Started in the background by a script (`make run &`), a shell hands us SIGINT
        # ignored and Python keeps it so: an interrupt would do nothing. Both stop us.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._watch(children)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping the platform (the worker finishes its requests)...")
        finally:
            self._stop(children)
            # Nothing is left to stop but the embedded Redis, which manage.py shuts down as
            # this process exits: a Ctrl-C pressed meanwhile must not break that off.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _banner(self, base: str, receiver_port: int, logins: dict[str, str]) -> None:
        redis_note = " (embedded)" if settings.EMBEDDED_REDIS else ""
        self.stdout.write(
            self.style.SUCCESS("\nThe platform is running:\n")
            + f"  operations      {base}/admin/overview/   (user admin, password {logins['admin']})\n"
            + f"  admin           {base}/admin/\n"
            + self._two_factor_note()
            + f"  tenant pages    {base}/t/   (password {logins['alpha']} for each)\n"
            + f"    user big      {demo.LOUD_TENANT}'s admin: its flood, paced\n"
            + f"    user charlie  {demo.QUIET_TENANTS[2]}'s admin: a failing endpoint, dead "
            + "letters to replay\n"
            + f"    user alpha    a viewer of {demo.QUIET_TENANTS[0]}: reads, changes nothing\n"
            + f"  metrics         {base}/metrics\n"
            + f"  ingest          POST {base}/ingest/{demo.DEMO_SOURCE_SLUG}/ (Shopify-signed, "
            + f"secret {demo.DEMO_SOURCE_SECRET!r})\n"
            + f"  demo receiver   http://127.0.0.1:{receiver_port}/\n"
            + f"  redis           {settings.REDIS_URL}{redis_note}\n"
            + "What to look at in the first two minutes: README.md, 'A two-minute tour'.\n"
            + "Press Ctrl-C to stop.\n"
        )
        self.stdout.flush()

    @staticmethod
    def _two_factor_note() -> str:
        if env_bool("ADMIN_REQUIRE_2FA", False):
            return "                  (two-factor sign-in on: set up an authenticator at sign-in)\n"
        return (
            "                  (two-factor sign-in is off in this demo, ADMIN_REQUIRE_2FA=false;\n"
            "                  production asks every operator for an authenticator code)\n"
        )

    def _watch(self, children: dict[str, subprocess.Popen]) -> None:
        started = time.monotonic()
        next_status = started + STATUS_EVERY_SECONDS
        last_delivered = None
        while True:
            for name, child in children.items():
                if child.poll() is not None:
                    self.stderr.write(
                        f"The {name} stopped unexpectedly (exit code {child.returncode}); "
                        "stopping the rest."
                    )
                    return
            if time.monotonic() >= next_status:
                next_status += STATUS_EVERY_SECONDS
                last_delivered = self._status_line(time.monotonic() - started, last_delivered)
            time.sleep(0.5)

    def _status_line(self, elapsed: float, last_delivered: int | None) -> int | None:
        """One line: deliveries, the loud shop's backlog, the quiet shops' oldest wait."""
        try:
            scheduler = get_scheduler()
            snapshot, counters = scheduler.snapshot(top_n=20), scheduler.counters()
        except Exception as exc:  # a status line must never stop the platform
            self.stdout.write(f"[{elapsed:4.0f}s] scheduler unavailable: {exc}")
            return last_delivered
        ids = {row.tenant_id for row in snapshot.tenants}  # at most top_n, not every tenant
        keys = dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "key"))
        rows = {keys.get(row.tenant_id, "?"): row for row in snapshot.tenants}
        loud = rows.get(demo.LOUD_TENANT)
        quiet = [rows[key].oldest_age_seconds for key in demo.QUIET_TENANTS[:2] if key in rows]
        failing = rows.get(demo.QUIET_TENANTS[2])
        hung = rows.get(demo.QUIET_TENANTS[3])
        delivered = counters.get("delivered", 0)
        pace = ""
        if last_delivered is not None and delivered >= last_delivered:
            pace = f" (+{delivered - last_delivered:,})"
        self.stdout.write(
            f"[{elapsed:4.0f}s] delivered {delivered:,}{pace}"
            + (
                f" | big-shop {loud.fresh + loud.retry:,} waiting, oldest {loud.oldest_age_seconds:.1f}s"
                if loud
                else " | big-shop none waiting"
            )
            + f" | alpha/bravo oldest {max(quiet, default=0.0):.1f}s"
            + f" | charlie's failing endpoint: {failing.retry + failing.delayed if failing else 0:,} retries waiting"
            + f" | delta (hangs) {hung.in_flight if hung else 0} in flight"
            + _limits_of(
                demo.QUIET_TENANTS[3], {row.endpoint_id: row for row in snapshot.endpoints}
            )
            + f" | retries {counters.get('retry', 0):,} | dead letters {counters.get('dead', 0):,}"
        )
        self.stdout.flush()
        return delivered

    def _stop(self, children: dict[str, subprocess.Popen]) -> None:
        """SIGTERM each child and wait for them (the worker finishes in-flight deliveries).
        A second Ctrl-C stops them at once: a second SIGTERM (the worker then exits, and
        its leases bring unfinished work back), so that the embedded Redis, stopped as
        this process exits, never goes before the worker does."""
        first = time.monotonic()
        try:
            self._signal_and_wait(children, grace=40.0)
        except KeyboardInterrupt:
            self.stdout.write("Stopping at once (unfinished deliveries are sent again later)...")
            self.stdout.flush()
            # RQ takes a second signal within 1 s of the first for a repeat, and ignores it.
            time.sleep(max(0.0, first + RQ_REPEAT_SECONDS - time.monotonic()))
            self._signal_and_wait(children, grace=10.0)

    @staticmethod
    def _signal_and_wait(children: dict[str, subprocess.Popen], grace: float) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        # The embedded Redis, if this command's process started it, is stopped by
        # manage.py (project.launch) as it exits.


def _limits_of(tenant_key: str, rows: dict[int, EndpointRow]) -> str:
    """ " (cap 2 + 1 for retries)", or where limits adapt " (adaptive limit 1 of 64 + 1 for
    retries)" from the snapshot's `rows` by endpoint: a retry has a slot of its own beside
    the limit, so a hung endpoint holds up to both."""
    endpoints = list(Endpoint.objects.filter(tenant__key=tenant_key))
    if not endpoints:
        return ""
    caps = sum(endpoint.in_flight_cap for endpoint in endpoints)
    retry = sum(endpoint.retry_max_in_flight for endpoint in endpoints)
    if not any(endpoint.adapts_concurrency for endpoint in endpoints):
        return f" (cap {caps} + {retry} for retries)"
    if not all(endpoint.pk in rows for endpoint in endpoints):
        # The schedule holds nothing of one yet: its limit starts anew with its next request.
        return f" (adaptive limit, at most {caps}, + {retry} for retries)"
    limits = sum(rows[endpoint.pk].in_flight_limit for endpoint in endpoints)
    return f" (adaptive limit {limits} of {caps} + {retry} for retries)"
