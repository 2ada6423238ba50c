"""`manage.py simulate SCENARIO`: the platform end to end under a noisy neighbour.

Thin on purpose: parse the arguments, take a Redis database and a database for the
simulation, and run simulation.session in a child process whose environment
points the whole platform at them (settings come from the environment, so that is the
one clean way to swap both stores). The child prints progress and the results.
"""

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from argparse import RawDescriptionHelpFormatter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core import redis_connection
from simulation.environment import (
    ROOT,
    SCHEDULE_TAG_BASE,
    RedisDatabase,
    child_env,
    prepare_database,
    schedule_env,
)
from simulation.scenarios import DEFAULTS, SCENARIOS

MAX_SHARDS = 64  # SCHEDULER_SHARDS' maximum in project/settings.py

HELP = """\
Run the real platform under a noisy neighbour and measure who waits.

Starts real delivery workers (`manage.py rqworker default maintenance`) as
subprocesses, a fast local receiver in its own process, and sends events over time
through the platform's accept path (bulk, in process). Every delivery's latency is
measured from acceptance (the commit) to its arrival at the receiver.

scenarios:
  flood           one loud tenant sends, for 40 s, four times what the workers deliver
                  (a probe measures that first, unless --loud-events is given); 200
                  quiet tenants send 3 events each during it. Reports quiet and loud
                  latency, loud tenant's finish time.
  slow-endpoints  200 endpoints, 40 of which hang until their timeout (3 s). Reports
                  healthy endpoints' latency and the slots the hung ones held.
  retry-storm     a large endpoint is down (503) for 20 s while its retries pile up,
                  then recovers. Reports its request rate after the recovery and the
                  other tenants' latency.
  fragile-endpoints
                  one tenant sends 300 events/s for 30 s to a receiver that takes C = 50
                  requests at once at 250 ms each (slower past C, 503 past 2C), C halving
                  after 10 s and doubling back after 20 s; 20 quiet tenants share the
                  workers. The run ends with its window. Reports goodput against
                  capacity, the share of 503s, and the time to converge after a change.

--compare runs the fair platform and a baseline back to back: flood vs FIFO;
slow-endpoints vs no caps, plus a run where nothing hangs; retry-storm vs no caps;
fragile-endpoints its adaptive limit vs a static cap of 4 and vs no caps.
A run takes one to three minutes (a flood run drains its backlog, which the probe
sized for this machine); --rounds 3 repeats them for medians on a noisy machine.

examples:
  manage.py simulate flood --compare --plot flood.svg
  manage.py simulate slow-endpoints --compare --json slow.json
  manage.py simulate retry-storm --no-caps --redis-url redis://127.0.0.1:6379/7
  manage.py simulate flood --compare --shards 3 --own-endpoints

The database is a fresh SQLite file in a temporary directory unless --database-url
names one (created if missing; it must be empty or used by earlier simulations).
Redis: db 12 of the configured server, or the first free one of 7, 4, 3, 2, 1; only
an empty or simulation-owned database is ever flushed. Each run also reports the Redis
server's CPU and commands per delivery (INFO deltas over the run, scripts' own commands
included): the whole server's, so give it a private one (--redis-url) for figures that
are the platform's alone; none when the schedule is elsewhere (--scheduler-redis-url).
"""


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # Keep the help's line breaks.
        return super().create_parser(
            prog_name, subcommand, formatter_class=RawDescriptionHelpFormatter, **kwargs
        )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("scenario", choices=SCENARIOS)
        runs = parser.add_argument_group("what to run")
        runs.add_argument(
            "--scheduler",
            choices=("fair", "fifo"),
            default="fair",
            help="scheduler mode of the workers (default fair)",
        )
        runs.add_argument(
            "--no-caps",
            action="store_true",
            help="raise every endpoint cap to 1000 (the no-cap baseline)",
        )
        runs.add_argument(
            "--compare",
            action="store_true",
            help="run fair and the scenario's baseline(s) back to back and print the ratios",
        )
        runs.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="repeat the runs this many times, alternating their order, and report medians: this machine is shared and one run's p99 is noisy",
        )
        runs.add_argument(
            "--adaptive",
            action="store_true",
            help="limits that adapt (DELIVERY_ADAPTIVE_CONCURRENCY=all) in the fair runs that have caps; FIFO and no-caps runs stay as they are. Endpoints on the platform's default caps get no cap of their own, so the platform's ceiling (DELIVERY_ADAPTIVE_CEILING) bounds them. Shows how hung, slow or flooded endpoints fare where limits adapt (fragile-endpoints has an adaptive run already)",
        )
        runs.add_argument(
            "--shards",
            type=int,
            default=1,
            help="SCHEDULER_SHARDS of the fair runs: the schedule split by endpoint into this many shards on the simulation's Redis database (default 1; FIFO baselines stay one queue)",
        )
        runs.add_argument(
            "--scheduler-redis-url",
            help=f"every run's schedule on this Redis instead of the simulation's database: redis://host:port/db, or a Redis Cluster's seed nodes, redis+cluster://host:port,host:port. Its keys carry hash tags of the simulation's own (from {SCHEDULE_TAG_BASE}) and are cleared before each run; a tag holding a schedule the simulation did not write is refused",
        )
        runs.add_argument("--workers", type=int, help="worker processes (default 2)")
        runs.add_argument(
            "--slots",
            type=int,
            help="DELIVERY_CONCURRENCY per worker: requests in flight at once (flood 16, slow-endpoints 100, retry-storm 32, fragile-endpoints 128)",
        )
        runs.add_argument(
            "--seconds",
            type=float,
            help="how long traffic is sent (flood: the loud tenant, 40; slow-endpoints 30; retry-storm 40; fragile-endpoints 30, its measured window)",
        )
        runs.add_argument(
            "--cap",
            type=int,
            help="endpoints' max_in_flight (flood 64 on the shared destination, slow-endpoints 2, retry-storm 4 on the large endpoint, fragile-endpoints 4 on the fragile one)",
        )
        runs.add_argument("--seed", type=int, default=1, help="random seed of the traffic plan")
        runs.add_argument(
            "--timeout",
            type=float,
            default=600,
            help="stop a run after this many seconds (default 600)",
        )
        flood = parser.add_argument_group("flood")
        flood.add_argument(
            "--loud-events",
            type=int,
            help="events the loud tenant sends during --seconds (default: 4x the deliveries/s a probe run measures, times --seconds, so that any machine is overloaded)",
        )
        flood.add_argument(
            "--quiet-seconds",
            type=float,
            help="quiet tenants send at random moments in this window (default 45)",
        )
        flood.add_argument("--quiet-tenants", type=int, help="quiet tenants (default 200)")
        flood.add_argument("--quiet-events", type=int, help="events per quiet tenant (default 3)")
        flood.add_argument(
            "--own-endpoints",
            action="store_true",
            help="each tenant its own endpoint, not one shared destination",
        )
        slow = parser.add_argument_group("slow-endpoints")
        slow.add_argument("--endpoints", type=int, help="endpoints, one tenant each (default 200)")
        slow.add_argument("--hung", type=int, help="endpoints that hang (default 40)")
        slow.add_argument(
            "--endpoint-timeout", type=int, help="the endpoints' timeout_seconds (default 3)"
        )
        slow.add_argument(
            "--rate",
            type=float,
            help="events/s per endpoint (slow-endpoints) or per other or quiet tenant (retry-storm, fragile-endpoints); default 1",
        )
        storm = parser.add_argument_group("retry-storm")
        storm.add_argument(
            "--tenants",
            type=int,
            help="other tenants (retry-storm, default 50) or quiet ones (fragile-endpoints, 20)",
        )
        storm.add_argument(
            "--storm-rate", type=float, help="events/s to the large endpoint (default 40)"
        )
        storm.add_argument(
            "--outage-start", type=float, help="seconds until it goes down (default 5)"
        )
        storm.add_argument(
            "--outage-seconds", type=float, help="how long it stays down (default 20)"
        )
        storm.add_argument(
            "--service-ms",
            type=float,
            help="its time per request (retry-storm, default 20; fragile-endpoints, at up to C at once, 250)",
        )
        storm.add_argument(
            "--retry-cap", type=int, help="its retry_max_in_flight (default 1, both scenarios)"
        )
        storm.add_argument(
            "--retry-after",
            action="store_true",
            help="its 503s carry a Retry-After naming the recovery (a maintenance page), so the platform holds its work instead of retrying",
        )
        storm.add_argument(
            "--retry-schedule",
            help="RETRY_SCHEDULE_SECONDS of the workers (default 1,2,4,4,4,4,4,4,4,4,4,4)",
        )
        fragile = parser.add_argument_group("fragile-endpoints")
        fragile.add_argument(
            "--capacity",
            type=int,
            help="C: requests the fragile endpoint takes at once at full speed, at the start (default 50)",
        )
        fragile.add_argument(
            "--fragile-rate", type=float, help="events/s to the fragile endpoint (default 300)"
        )
        out = parser.add_argument_group("where")
        out.add_argument(
            "--database-url",
            help="database to use (default: a fresh SQLite file in a temporary directory)",
        )
        out.add_argument(
            "--redis-url",
            help="Redis server, with /N to name the database (default: the configured server, db 12 or the first free one)",
        )
        out.add_argument("--json", help="write the figures of every run to this file")
        out.add_argument(
            "--plot",
            help="write an SVG of the latency distributions (or request rates) to this file",
        )
        out.add_argument(
            "--keep-workdir",
            action="store_true",
            help="keep the temporary directory (database, worker logs)",
        )

    def handle(self, *args: Any, **raw: Any) -> None:
        options = resolve(raw)
        workdir = Path(tempfile.mkdtemp(prefix="simulate-"))
        keep = raw["keep_workdir"]
        redis_db = None
        try:
            database_url = prepare_database(raw["database_url"], workdir)
            # Without --redis-url: the configured server, never its configured database.
            redis_db = RedisDatabase.claim(
                raw["redis_url"] or settings.REDIS_URL, choose=not raw["redis_url"]
            )
            self.stdout.write(
                f"simulate {options['scenario']}: Redis {redis_db.url}, database {database_url}"
                + (f", fair runs on {options['shards']} shards" if options["shards"] > 1 else "")
                + (
                    f", schedule on {redis_connection.without_password(options['scheduler_redis_url'])}"
                    if options["scheduler_redis_url"]
                    else ""
                )
            )
            env = child_env(
                database_url,
                redis_db.url,
                workdir,
                SIMULATE_OPTIONS=json.dumps(options),
                SIMULATE_WORKDIR=str(workdir),
                SIMULATE_REDIS_TOKEN=redis_db.token,
                **schedule_env(options),
            )
            code = _run_child(env)
            if code != 0:
                keep = True
                raise CommandError(f"the simulation failed (exit {code}); logs in {workdir}")
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if redis_db is not None:
                redis_db.release()
            if keep:
                self.stdout.write(f"work directory kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


def resolve(raw: dict[str, Any]) -> dict[str, Any]:
    """The command's options with the scenario's defaults filled in; a knob of another
    scenario is an error rather than silently ignored."""
    scenario = raw["scenario"]
    defaults = DEFAULTS[scenario]
    knobs = {key for table in DEFAULTS.values() for key in table}
    foreign = sorted(k for k in knobs - set(defaults) if raw.get(k) is not None)
    if foreign:
        names = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise CommandError(f"{names} does not apply to {scenario}")
    if raw["own_endpoints"] and scenario != "flood":
        raise CommandError("--own-endpoints applies to flood only")
    if raw["retry_after"] and scenario != "retry-storm":
        raise CommandError("--retry-after applies to retry-storm only")
    options = {
        key: raw[key] if raw.get(key) is not None else value for key, value in defaults.items()
    }
    for path in ("json", "plot"):
        options[path] = str(Path(raw[path]).resolve()) if raw[path] else None
    options.update(
        scenario=scenario,
        scheduler=raw["scheduler"],
        no_caps=raw["no_caps"],
        compare=raw["compare"],
        seed=raw["seed"],
        rounds=max(1, raw["rounds"]),
        timeout=raw["timeout"],
        own_endpoints=raw["own_endpoints"],
        retry_after=raw["retry_after"],
        command=" ".join(["manage.py", "simulate", *sys.argv[2:]]) if len(sys.argv) > 1 else "",
    )
    if raw["adaptive"] and scenario == "fragile-endpoints":
        raise CommandError("fragile-endpoints has its adaptive run already; drop --adaptive")
    if raw["adaptive"] and raw["no_caps"]:
        raise CommandError(
            "--no-caps runs without limits and --adaptive with limits that adapt: choose one"
        )
    options["adaptive"] = raw["adaptive"]
    if options["compare"] and (options["scheduler"] != "fair" or options["no_caps"]):
        raise CommandError("--compare chooses the runs itself; drop --scheduler/--no-caps")
    if not 1 <= raw["shards"] <= MAX_SHARDS:
        raise CommandError(f"--shards must be from 1 to {MAX_SHARDS} (SCHEDULER_SHARDS' range)")
    if raw["shards"] > 1 and options["scheduler"] != "fair":
        raise CommandError("--shards applies to the fair scheduler only")
    options["shards"] = raw["shards"]
    options["scheduler_redis_url"] = _schedule_url(raw.get("scheduler_redis_url"))
    return options


def _schedule_url(url: str | None) -> str | None:
    """--scheduler-redis-url, checked: a clear error now, not a worker that dies later."""
    if not url:
        return None
    if redis_connection.is_cluster_url(url):
        try:
            redis_connection.cluster_seeds(url)
        except ValueError as exc:
            raise CommandError(f"--scheduler-redis-url: {exc}") from exc
        return url
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise CommandError(
            "--scheduler-redis-url must be a redis://, rediss://, unix:// or "
            f"{redis_connection.CLUSTER_SCHEME}:// URL, not {url!r}"
        )
    return url


def _run_child(env: dict[str, str]) -> int:
    child = subprocess.Popen([sys.executable, "-m", "simulation.session"], cwd=ROOT, env=env)
    # A SIGTERM to us goes on to the child, which stops its workers before it exits.
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            # The child got the Ctrl-C as well and is stopping its workers: wait for it.
            continue
