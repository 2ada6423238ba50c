"""Where a redis-server's CPU goes while it runs the scheduler: a script, not a test.

    .venv/bin/python bench/redis_profile.py --server PATH [--mix flood] [--deliveries 10000]
        [--frequency 1999] [--json]

It starts `--server` on a directory of its own, drives bench/shards.py's calls (enqueue,
pick, answered, retry_later, ack) on it, samples the server with `perf record
--call-graph dwarf` meanwhile, and reports the share of the samples in each part:

- `fcall`: inside the scripts' FCALLs (or EVALSHAs, on a server without Functions);
- `redis_call` of it: inside `redis.call`, and `command` of that, the command's own run
  (the rest is turning Lua arguments into a command and the reply back into Lua);
- `lua_own`: the Lua VM outside `redis.call`, each sample in one part by the innermost
  C function in its stack that names one (table reads and writes, growing tables, the
  garbage collector, ...), `vm_dispatch` for the VM's own instructions, or `other`;
- `outside_fcall`: the network, the event loop and the kernel.

The server needs its symbols: Debian's redis-server has none for its Lua. One built from
the same source with them:

    apt-get source redis   # with a deb-src line for the release
    make -C redis-7.0.15 -j2 CFLAGS="-g -fno-omit-frame-pointer"

`perf` (Debian's linux-perf) must be allowed to read the process.
"""

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import shards  # noqa: E402
from tests.private_redis import PrivateRedis  # noqa: E402

Stack = list[str]  # one sample's functions, innermost first

# The C functions a sample of Lua's own work is charged to, by what they do: the
# innermost of them in its stack decides (growing a table is inside a table write, the
# garbage collector inside whatever allocated), so each sample counts in one part.
LUA_PARTS: dict[str, tuple[str, ...]] = {
    "table_reads_and_writes": ("luaV_gettable", "luaV_settable", "luaH_get", "luaH_getnum"),
    "table_growth": ("newkey", "luaH_resize", "resize"),
    "new_tables": ("luaH_new",),
    "garbage_collector": ("luaC_step", "luaC_fullgc"),
    "strings": ("luaS_newlstr", "luaV_concat"),
    "calls_and_c_functions": ("luaD_precall",),  # a call, and the C it runs (string.format, ...)
}


def record(server: str, mix: str, deliveries: int, frequency: int, data: Path) -> None:
    """Drive one run of `mix` on a private `server` while perf samples it into `data`."""
    shards.mix = shards.MIXES[mix]
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as directory:
        private = PrivateRedis(Path(directory), server)
        private.start()
        try:
            conn = redis.Redis.from_url(private.url)
            shards.cost(conn, min(deliveries, 3_000), 500, 21)  # loads the scripts, warms up
            pid = str(conn.info("server")["process_id"])
            sampling = ["-F", str(frequency), "--call-graph", "dwarf,16384"]
            perf = subprocess.Popen(
                ["perf", "record", *sampling, "-p", pid, "-o", str(data)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)  # perf attaches
            shards.cost(conn, deliveries, 500, 21)
            perf.send_signal(signal.SIGINT)
            perf.wait()
        finally:
            private.stop()


def stacks(data: Path) -> list[Stack]:
    text = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out: list[Stack] = []
    current: Stack = []
    for line in text.splitlines():
        parts = line.split(None, 1)
        if not parts:
            if current:
                out.append(current)
            current = []
            continue
        current.append(parts[1].split("+")[0] if len(parts) > 1 else "?")
    if current:
        out.append(current)
    return out


def command_run(s: Stack) -> bool:
    """Inside a command that a script's redis.call runs (Redis 7's scriptCall, or 6.2's
    call, innermost first: before redis.call in the stack)."""
    if "luaRedisGenericCommand" not in s:
        return False
    inner = s[: s.index("luaRedisGenericCommand")]
    return "scriptCall" in inner or "call" in inner


PART_OF = {name: part for part, names in LUA_PARTS.items() for name in names}


def lua_part(s: Stack) -> str:
    """The part of Lua's own work a sample of it counts in: `vm_dispatch` for the VM's
    own instructions, `other` for a C function in no part."""
    if s[0] == "luaV_execute":
        return "vm_dispatch"
    return next((PART_OF[name] for name in s if name in PART_OF), "other")


def shares(samples: list[Stack]) -> dict:
    """Each part's share of the samples, in percent."""

    def share(test: Callable[[Stack], bool]) -> float:
        return round(100 * sum(1 for s in samples if test(s)) / len(samples), 1)

    def in_script(s: Stack) -> bool:
        return "luaCallFunction" in s or "evalGenericCommand" in s

    def lua_own(s: Stack) -> bool:
        return "luaV_execute" in s and "luaRedisGenericCommand" not in s

    return {
        "samples": len(samples),
        "fcall": share(in_script),
        "redis_call": share(lambda s: "luaRedisGenericCommand" in s),
        "command": share(command_run),
        "lua_own": share(lua_own),
        "lua_own_by_part": {
            part: share(lambda s, part=part: lua_own(s) and lua_part(s) == part)
            for part in [*LUA_PARTS, "vm_dispatch", "other"]
        },
        "outside_fcall": share(lambda s: not in_script(s)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="a redis-server built with symbols")
    parser.add_argument("--mix", choices=shards.MIXES, default="tenants")
    parser.add_argument("--deliveries", type=int, default=10_000)
    parser.add_argument("--frequency", type=int, default=1999, help="samples per second")
    parser.add_argument("--json", action="store_true", help="print only the results, as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-perf-") as directory:
        data = Path(directory) / "perf.data"
        record(args.server, args.mix, args.deliveries, args.frequency, data)
        samples = stacks(data)
    if not any("luaV_execute" in s for s in samples):
        sys.exit(
            f"{args.server} has no symbols for its Lua: build one that has"
            " (bench/redis_profile.py's docstring says how)"
        )
    results = shares(samples)
    results["mix"] = args.mix
    shards.report(results, args.json)


if __name__ == "__main__":
    main()
