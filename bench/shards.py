"""Redis work per delivery, and scheduler throughput over 1, 2 and 3 shards. A script,
not a test:

    .venv/bin/python bench/shards.py [--json] [--deliveries 20000] [--rounds 3]
        [--against DIR]  # also an older checkout's scripts, interleaved, same server
        [--by-command]  # also each call's commands split by command
        [--mix flood]  # one tenant floods one endpoint, then quiet tenants (the gateway)
        [--pick 4]  # leases per pick (32 by default)
        [--adaptation]  # also with the endpoints' adaptive limits off and on, interleaved
        [--fifo]  # also this checkout in FIFO mode, interleaved (with --against: three ways)
        [--without-answered]  # also with answered left out (what folding it into ack saves)

It starts a redis-server of its own (so that the INFO deltas count only this bench) and
runs the scheduler alone, in-process: enqueue in batches, then pick / answered / ack in
batches as the delivery engine does, with a mix of many tenants, a few endpoints each,
tight caps on some, and a share of first attempts that fail once and are retried.

- `redis_cpu_us_per_delivery`: the server's used_cpu_sys + used_cpu_user delta over a
  run, divided by the deliveries finished (enqueue, pick, answered, ack and retries).
- `commands_per_delivery`: every command the server ran in that run (INFO commandstats
  delta, which counts the scripts' own redis.call()s as well as the EVALSHAs or FCALLs), divided
  the same way.
- `redis_cpu_us_per_single_enqueue`: the server's CPU per enqueue call of one delivery,
  what a single accepted event (a signed POST) costs the schedule at ingest.
- `deliveries_per_s_by_shards`: S processes, each running the same loop on its own
  shard's keys (`wh:{N}:`) on the one server, all started together: deliveries finished
  per second of wall time. Scheduler only: on two cores, Redis and the loops compete.

`--by-command` adds one more run that reads INFO commandstats around every call and reports,
per call (enqueue, pick, answered, retry_later, ack), the commands its script ran per
delivery, split by command, and the server's time in that call's scripts.

`--against DIR` (a worktree of an older commit with a named protocol, 76785dc or later,
e.g. `git worktree add /tmp/base40 1af3362`) runs that checkout's scripts and this one's
on the same workload, interleaved call by call on the same server, and reports each
one's server time inside scripts (`script_us_per_delivery`, INFO commandstats usec of
EVALSHA or FCALL) and commands: CPU figures swing by ±30% from run to run on this shared
machine, so only a ratio measured in one run, side by side, says whether a change made
the scripts cheaper. It also enqueues up to 5,000 of the deliveries one per call with
each version, interleaved (`single_enqueue_script_us`, `single_enqueue_commands`: what
one signed POST's enqueue costs each).

`--fifo` runs this checkout's fair mode and its FIFO mode (one arrival-order line: no
lanes, turns or rotations), and with `--against` the older scripts too, interleaved the
same way, and reports each one's script time per call and
`script_us_per_delivery_fair_over_fifo` (`_before_over_fifo`): what fairness costs on
top of what any delivery's enqueue, answer and ack cost.

`--without-answered` runs this checkout as the engine calls it and with `answered` left
out (each `ack` then gives its leases' slots back itself), interleaved the same way:
`script_us_per_delivery_with_over_without` is the most that folding `answered` into
`ack` could save. (The engine keeps it: it frees a slot when the request ends, not after
its outcome is written.)

`--adaptation` runs this checkout twice, interleaved the same way: without adaptive
limits, and with them (every item flagged adaptive, every answered call carrying each
endpoint's answers, as the engine's do with DELIVERY_ADAPTIVE_CONCURRENCY), and reports
`script_us_per_delivery_with_over_without` and `commands_per_delivery_with_over_without`.
"""

import argparse
import importlib
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.ids import new_ulid
from core.redis_cost import server_work
from delivery.scheduler import FRESH, EndpointAnswers, Item, Lease, Scheduler, protocol
from tests.private_redis import PrivateRedis

ENQUEUE_BATCH = 100  # what one publish or ingest flush enqueues, about
PICK = 32  # the engine picks half its room at once (MAX_PICK 64, 64 slots)
RETRY_SHARE = 0.05  # first attempts that fail once and come back as retries
SHARD_COUNTS = (1, 2, 3)


def workload(n: int, tenants: int, seed: int) -> list[Item]:
    """n deliveries over `tenants` tenants with 1-3 endpoints each, weights 1-3, caps of
    1-8 (a quarter of the endpoints at 1 or 2, so lanes park), and a skew: a tenth of
    the tenants send half of the traffic."""
    rng = random.Random(seed)
    loud = max(1, tenants // 10)
    endpoints = {
        t: [(t * 4 + j, rng.choice((1, 2, 4, 4, 8, 8, 8, 8))) for j in range(1 + t % 3)]
        for t in range(tenants)
    }
    work = []
    for _ in range(n):
        t = rng.randrange(loud) if rng.random() < 0.5 else rng.randrange(tenants)
        endpoint, cap = rng.choice(endpoints[t])
        work.append(
            Item(
                new_ulid(),
                t,
                endpoint,
                weight=1 + t % 3,
                max_in_flight=cap,
                retry_max_in_flight=cap,
            )
        )
    return work


def flood(n: int, tenants: int, seed: int) -> list[Item]:
    """bench/scheduler.py's flood, the gateway case: one tenant sends n - tenants
    deliveries to one endpoint (a cap that never binds), then `tenants` quiet tenants one
    each to the same endpoint."""
    loud = [Item(new_ulid(), 0, 1, max_in_flight=10_000) for _ in range(n - tenants)]
    return loud + [Item(new_ulid(), t, 1, max_in_flight=10_000) for t in range(1, tenants + 1)]


MIXES = {"tenants": workload, "flood": flood}
mix = workload  # --mix chooses; module-level so that the shard processes inherit it


def steps(sched: Scheduler, work: list[Item], seed: int, adaptive: bool = False):
    """The engine's calls on `work`, one scheduler call per step: enqueue in batches, then
    pick / answered / retry_later / ack in batches until every delivery is acked. Yields
    the name of each call once it is made. `adaptive`: the endpoints' limits adapt, and
    each answered call carries every endpoint's answers (fast ones, 50 ms each), as the
    engine's do with DELIVERY_ADAPTIVE_CONCURRENCY."""
    rng = random.Random(seed)
    if adaptive:
        work = [replace(item, adaptive=True) for item in work]
    for i in range(0, len(work), ENQUEUE_BATCH):
        sched.enqueue(work[i : i + ENQUEUE_BATCH])
        yield "enqueue"
    finished = 0
    while finished < len(work):
        picked = sched.pick("bench", PICK)
        yield "pick"
        if not picked.leases:
            # Only a retry not yet due can leave nothing dispatchable: wait for it.
            time.sleep(min(picked.wait_seconds, 0.01))
            continue
        answers = _answers(picked.leases) if adaptive else ()
        sched.answered(picked.leases, answers)
        yield "answered"
        done, retries = [], []
        for lease in picked.leases:
            if lease.lane == FRESH and rng.random() < RETRY_SHARE:
                retries.append((lease, time.time()))
            else:
                done.append(lease)
        if retries:  # one call per settled group, as sending.settle does
            sched.retry_later_many(retries)
            yield "retry_later"
        sched.ack(done, outcome="delivered")
        finished += len(done)
        yield "ack"


def _answers(leases: list[Lease]) -> list[EndpointAnswers]:
    per_endpoint = Counter(lease.endpoint_id for lease in leases)
    return [EndpointAnswers(e, ok=n, latency_ms=50.0 * n) for e, n in per_endpoint.items()]


def run(conn: redis.Redis, shard: int, work: list[Item], seed: int, turn_size: int = 1) -> int:
    """Enqueue everything, then drain it as the engine does; returns deliveries finished."""
    for _ in steps(Scheduler(conn, shard=shard, turn_size=turn_size), work, seed):
        pass
    return len(work)


def cost(conn: redis.Redis, n: int, tenants: int, seed: int, turn_size: int = 1) -> dict:
    """One run on shard 0: the server's CPU and commands per delivery."""
    work = mix(n, tenants, seed)
    Scheduler(conn, shard=0).clear()
    cpu0, calls0 = server_work(conn)
    started = time.perf_counter()
    done = run(conn, 0, work, seed, turn_size)
    seconds = time.perf_counter() - started
    cpu1, calls1 = server_work(conn)
    return {
        "redis_cpu_us_per_delivery": (cpu1 - cpu0) * 1e6 / done,
        "commands_per_delivery": (calls1 - calls0) / done,
        "deliveries_per_s": done / seconds,
    }


def single_enqueue_cost(conn: redis.Redis, n: int, tenants: int, seed: int) -> float:
    """Server CPU (µs) per enqueue of one delivery per call: what each single accepted
    event costs the schedule at ingest (the publish API batches; a signed POST does not)."""
    work = mix(n, tenants, seed)
    sched = Scheduler(conn, shard=0)
    sched.clear()
    cpu0, _ = server_work(conn)
    for item in work:
        sched.enqueue([item])
    cpu1, _ = server_work(conn)
    sched.clear()
    return (cpu1 - cpu0) * 1e6 / n


def _shard_loop(url: str, shard: int, n: int, tenants: int, seed: int, barrier) -> None:
    conn = redis.Redis.from_url(url)
    work = mix(n, tenants, seed + shard)
    Scheduler(conn, shard=shard).clear()
    barrier.wait()
    run(conn, shard, work, seed + shard)


def by_shards(url: str, shards: int, n: int, tenants: int, seed: int) -> float:
    """`shards` processes, one per shard, started together: deliveries per second."""
    barrier = multiprocessing.Barrier(shards + 1)
    procs = [
        multiprocessing.Process(target=_shard_loop, args=(url, s, n, tenants, seed, barrier))
        for s in range(shards)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    started = time.perf_counter()
    for proc in procs:
        proc.join()
    seconds = time.perf_counter() - started
    if any(proc.exitcode for proc in procs):
        sys.exit("a shard loop failed")
    return shards * n / seconds


# The script calls themselves, in INFO commandstats; every other command there is a script's
# own redis.call() (or INFO).
SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")


def script_counts(conn: redis.Redis) -> tuple[int, int, int]:
    """(microseconds the server spent in scripts, of those in the scripts' commands,
    commands run) so far, INFO left out."""
    stats = conn.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    inner = sum(v["usec"] for k, v in stats.items() if k not in ("cmdstat_info", *SCRIPT_CALLS))
    return sum(stats.get(k, {}).get("usec", 0) for k in SCRIPT_CALLS), inner, calls


def _other_module(other: Path, name: str) -> ModuleType:
    """Module `name` of the other checkout's delivery/scheduler, loaded as a package of its
    own ("other_scheduler"), so that its relative imports (scripts.py reads protocol.py)
    find that checkout's files, not this one's."""
    if "other_scheduler" not in sys.modules:
        package = ModuleType("other_scheduler")
        package.__path__ = [str(other / "delivery" / "scheduler")]
        sys.modules["other_scheduler"] = package
    return importlib.import_module(f"other_scheduler.{name}")


# Values of this checkout's arguments that an older protocol may lack, and the value
# that means what the older scripts did without them.
UNSAID = {"adaptive": "0"}


def _in_older_words(old: ModuleType, name: str, args: list) -> list:
    """This checkout's arguments to script `name`, repacked by name for the older
    protocol `old`: a field it lacks is dropped where it holds the UNSAID value, and an
    answered call's endpoint answers where there are none. Anything else the older
    scripts could not take is refused, not guessed."""
    common, own = args[: len(protocol.CALL.fields)], list(args[len(protocol.CALL.fields) :])
    if name == "enqueue" and old.ITEM.fields != protocol.ITEM.fields:
        size, packed = len(protocol.ITEM.fields), []
        for start in range(0, len(own), size):
            item = dict(zip(protocol.ITEM.fields, own[start : start + size], strict=True))
            for field in set(item) - set(old.ITEM.fields):
                if UNSAID.get(field) != item.pop(field):
                    raise ValueError(f"the older enqueue cannot take {field}")
            packed += old.ITEM.pack(item)
        own = packed
    elif name == "answered" and old.ANSWERED.fields != protocol.ANSWERED.fields:
        if own[0] != 0:
            raise ValueError("the older answered takes no endpoint answers")
        own = own[1:]
    return [*common, *own]


def _older_scripts(conn: redis.Redis, other: Path) -> dict:
    """The other checkout's scripts, each called with this checkout's arguments in the
    older protocol's words (_in_older_words)."""
    old = _other_module(other, "protocol")
    scripts = _other_module(other, "scripts").register_all(conn)

    def speaking(name: str, script):
        return lambda keys, args: script(keys=keys, args=_in_older_words(old, name, args))

    return {name: speaking(name, script) for name, script in scripts.items()}


def interleaved(
    conn: redis.Redis, names: dict[str, Scheduler], adaptive: dict[str, bool], args
) -> dict[str, dict]:
    """Each scheduler of `names` on the same workload, interleaved call by call on one
    server, each first in every other step: each call's server time in scripts and
    commands goes to its own account."""
    usec = {name: 0 for name in names}
    inner_usec = {name: 0 for name in names}
    commands = {name: Counter() for name in names}
    usec_by_call = {name: Counter() for name in names}
    work = mix(args.deliveries, args.tenants, args.seed)
    for round_ in range(args.rounds + 1):  # the first loads the scripts, uncounted
        going = {}
        for name, sched in names.items():
            sched.clear()
            going[name] = steps(sched, work if round_ else work[:200], args.seed, adaptive[name])
        turn = 0
        while going:
            # Each version goes first in every other step: the second of two calls in a
            # row ran measurably faster here (warm caches), whichever version it was.
            turn += 1
            for name in sorted(going, reverse=turn % 2 == 0):
                usec_before, inner_before, calls_before = script_counts(conn)
                try:
                    call = next(going[name])
                except StopIteration:
                    del going[name]
                    continue
                if round_:
                    usec_after, inner_after, calls_after = script_counts(conn)
                    usec[name] += usec_after - usec_before
                    inner_usec[name] += inner_after - inner_before
                    commands[name][call] += calls_after - calls_before
                    usec_by_call[name][call] += usec_after - usec_before
    deliveries = args.rounds * args.deliveries
    return {
        name: {
            "script_us_per_delivery": usec[name] / deliveries,
            # The commands' own share of it: the rest is Lua (its side of each call too).
            "commands_us_per_delivery": inner_usec[name] / deliveries,
            "commands_per_delivery": sum(commands[name].values()) / deliveries,
            "commands_per_delivery_by_call": {
                call: count / deliveries for call, count in commands[name].items()
            },
            "script_us_per_delivery_by_call": {
                call: usec / deliveries for call, usec in usec_by_call[name].items()
            },
        }
        for name in names
    }


def adaptation(conn: redis.Redis, args: argparse.Namespace) -> dict:
    """This checkout's scripts with the endpoints' adaptive limits off and on (items
    flagged, answered calls carrying answers), interleaved on one server: what adapting
    costs."""
    names = {"without": Scheduler(conn, shard=3), "with": Scheduler(conn, shard=4)}
    out = interleaved(conn, names, {"without": False, "with": True}, args)
    for key in ("script_us_per_delivery", "commands_per_delivery"):
        out[f"{key}_with_over_without"] = out["with"][key] / out["without"][key]
    return out


def older_scheduler(conn: redis.Redis, other: Path, shard: int) -> Scheduler:
    """This checkout's Scheduler running the scripts of `other`, an older checkout with a
    named protocol (delivery/scheduler/protocol.py, since 76785dc), on `shard`."""
    sched = Scheduler(conn, shard=shard)
    sched._scripts = _older_scripts(conn, other)
    return sched


def fifo(conn: redis.Redis, args: argparse.Namespace) -> dict:
    """This checkout's scripts in fair mode and in FIFO mode (one arrival-order line, no
    lanes, no turns), and with --against the older checkout's fair ones too, interleaved
    on one server: what the fairness costs, and how much of a delivery's Redis work is its
    enqueue, answer and ack, which a schedule without fairness pays as well."""
    names = {"fair": Scheduler(conn, shard=5), "fifo": Scheduler(conn, shard=6, mode="fifo")}
    if args.against:
        names["before"] = older_scheduler(conn, args.against.resolve(), shard=7)
    out = interleaved(conn, names, {name: False for name in names}, args)
    for name in names:
        if name != "fifo":
            out[f"script_us_per_delivery_{name}_over_fifo"] = (
                out[name]["script_us_per_delivery"] / out["fifo"]["script_us_per_delivery"]
            )
    return out


class _AckFreesSlots(Scheduler):
    """A scheduler whose `answered` does nothing: each ack gives its leases' slots back
    itself, as it does for a lease never answered."""

    def answered(self, leases: Sequence[Lease], answers: Sequence[EndpointAnswers] = ()) -> int:
        return 0


def without_answered(conn: redis.Redis, args: argparse.Namespace) -> dict:
    """This checkout's scripts as the engine calls them, and with `answered` left out,
    interleaved on one server: the most that folding `answered` into `ack` could save."""
    names = {"with": Scheduler(conn, shard=8), "without": _AckFreesSlots(conn, shard=9)}
    out = interleaved(conn, names, {name: False for name in names}, args)
    out["script_us_per_delivery_with_over_without"] = (
        out["with"]["script_us_per_delivery"] / out["without"]["script_us_per_delivery"]
    )
    return out


def against(conn: redis.Redis, other: Path, args: argparse.Namespace) -> dict:
    """The scripts of `other` (an older checkout: its lua/ and scripts.py, driven by this
    checkout's Scheduler through older_scheduler) and this checkout's, on the same
    workload, interleaved call by call on one server: each call's server time in scripts
    and commands go to its version's account."""
    names = {"before": older_scheduler(conn, other, shard=1), "after": Scheduler(conn, shard=2)}
    out = interleaved(conn, names, {name: False for name in names}, args)
    work = mix(args.deliveries, args.tenants, args.seed)
    single = single_enqueues_against(conn, names, work[: min(len(work), 5_000)])
    for name in names:
        out[name]["single_enqueue_script_us"], out[name]["single_enqueue_commands"] = single[name]
    for key in ("script_us_per_delivery", "commands_per_delivery", "single_enqueue_script_us"):
        out[f"{key}_before_over_after"] = out["before"][key] / out["after"][key]
    out["code_before"] = str(other)
    return out


def single_enqueues_against(
    conn: redis.Redis, names: dict[str, Scheduler], work: list[Item]
) -> dict[str, tuple[float, float]]:
    """Each version enqueues `work` one delivery per call (a single signed POST's enqueue),
    interleaved call by call, twice (the first uncounted): per call, the server's time in
    the script and the commands it ran."""
    usec = {name: 0 for name in names}
    commands = {name: 0 for name in names}
    for round_ in range(2):
        for sched in names.values():
            sched.clear()
        for i, item in enumerate(work):
            for name in sorted(names, reverse=i % 2 == 1):  # first in turn, as in against()
                sched = names[name]
                usec_before, _, calls_before = script_counts(conn)
                sched.enqueue([item])
                usec_after, _, calls_after = script_counts(conn)
                if round_:
                    usec[name] += usec_after - usec_before
                    commands[name] += calls_after - calls_before
    return {name: (usec[name] / len(work), commands[name] / len(work)) for name in names}


def by_command(conn: redis.Redis, args: argparse.Namespace) -> dict:
    """One more run of this checkout's scripts, `INFO commandstats` read around every
    call: per delivery, the commands each call ran inside its script, by command, and the
    server's time in that call's scripts. Where the commands go, for whoever cuts them."""
    sched = Scheduler(conn, shard=0)
    sched.clear()
    commands: dict[str, Counter] = {}
    usec: Counter = Counter()
    work = mix(args.deliveries, args.tenants, args.seed)
    calls = steps(sched, work, args.seed)
    while True:
        before = conn.info("commandstats")
        try:
            call = next(calls)
        except StopIteration:
            break
        after = conn.info("commandstats")
        mine = commands.setdefault(call, Counter())
        for key, stats in after.items():
            was = before.get(key, {"calls": 0, "usec": 0})
            if key == "cmdstat_info" or stats["calls"] == was["calls"]:
                continue
            if key in SCRIPT_CALLS:
                usec[call] += stats["usec"] - was["usec"]
            else:
                mine[key.removeprefix("cmdstat_")] += stats["calls"] - was["calls"]
    n = len(work)
    return {
        call: {
            "commands_per_delivery": sum(counts.values()) / n,
            "script_us_per_delivery": usec[call] / n,
            "by_command": {name: count / n for name, count in counts.most_common()},
        }
        for call, counts in commands.items()
    }


def medians(rounds: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def main() -> None:
    global mix, PICK
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the results, as JSON")
    parser.add_argument("--deliveries", type=int, default=20_000, help="per run and shard")
    parser.add_argument("--tenants", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument(
        "--turn-size",
        type=int,
        default=0,
        help="also report the costs with this SCHEDULER_TURN_SIZE (the default is 1)",
    )
    parser.add_argument("--against", type=Path, help="an older checkout to compare with")
    parser.add_argument(
        "--adaptation",
        action="store_true",
        help="also this checkout with the endpoints' adaptive limits off and on, interleaved",
    )
    parser.add_argument(
        "--fifo",
        action="store_true",
        help="also this checkout in FIFO mode beside its fair mode (and --against's scripts), "
        "interleaved",
    )
    parser.add_argument(
        "--without-answered",
        action="store_true",
        help="also this checkout with answered left out (each ack frees its slots), interleaved",
    )
    parser.add_argument(
        "--by-command",
        action="store_true",
        help="also one run that splits each call's commands by command (INFO commandstats "
        "around every call)",
    )
    parser.add_argument(
        "--mix",
        choices=MIXES,
        default="tenants",
        help="tenants: the mix above; flood: one tenant floods one endpoint, then quiet ones",
    )
    parser.add_argument(
        "--pick",
        type=int,
        default=PICK,
        help="leases per pick (the engine's picks are often smaller than 32: each call's "
        "fixed cost then weighs more per delivery)",
    )
    args = parser.parse_args()
    mix = MIXES[args.mix]
    PICK = args.pick

    with tempfile.TemporaryDirectory(prefix="bench-shards-") as directory:
        server = PrivateRedis(Path(directory))
        server.start()
        try:
            conn = redis.Redis.from_url(server.url)
            run(conn, 0, workload(200, 20, args.seed), args.seed)  # load the scripts
            rounds = [
                cost(conn, args.deliveries, args.tenants, args.seed) for _ in range(args.rounds)
            ]
            results = medians(rounds)
            results["redis_cpu_us_per_single_enqueue"] = statistics.median(
                single_enqueue_cost(conn, min(args.deliveries, 5_000), args.tenants, args.seed)
                for _ in range(args.rounds)
            )
            if args.turn_size > 1:
                results[f"turn_size_{args.turn_size}"] = cost(
                    conn, args.deliveries, args.tenants, args.seed, args.turn_size
                )
            results["deliveries_per_s_by_shards"] = {
                str(s): statistics.median(
                    by_shards(server.url, s, args.deliveries, args.tenants, args.seed)
                    for _ in range(args.rounds)
                )
                for s in SHARD_COUNTS
            }
            if args.against:
                results["against"] = against(conn, args.against.resolve(), args)
            if args.adaptation:
                results["adaptation"] = adaptation(conn, args)
            if args.fifo:
                results["fifo"] = fifo(conn, args)
            if args.without_answered:
                results["without_answered"] = without_answered(conn, args)
            if args.by_command:
                results["by_call"] = by_command(conn, args)
        finally:
            server.stop()
    results["mix"] = args.mix
    results["pick"] = PICK
    results["deliveries"] = args.deliveries
    results["tenants"] = args.tenants
    report(results, args.json)


def report(results: dict, as_json: bool) -> None:
    """Print the results: as JSON, or one `key: value` line each."""
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for key, value in results.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
