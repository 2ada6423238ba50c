"""Load the Lua scripts once per client; each runs by EVALSHA, falling back to EVAL (which
caches it on that server) if the server lost its script cache, e.g. after a restart."""

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

LUA_DIR = Path(__file__).with_name("lua")

# Each script is its own file after the shared rules; picks first do the bounded upkeep.
_PARTS = {
    "enqueue": ("lib", "enqueue"),
    "pick_fair": ("lib", "maintain", "pick_fair"),
    "pick_fifo": ("lib", "maintain", "pick_fifo"),
    "ack": ("lib", "ack"),
    "answered": ("lib", "answered"),
    "retry_later": ("lib", "retry_later"),
    "promote": ("lib", "promote"),
    "renew": ("lib", "renew"),
    "set_tenant": ("lib", "set_tenant"),
    "set_endpoint": ("lib", "set_endpoint"),
    "pause_endpoint": ("lib", "pause_endpoint"),
    "snapshot": ("lib", "snapshot"),
    "clear": ("clear",),
}


# After lib.lua, a script's own parts run as one function, so that whatever it returns,
# the counters lib.lua holds back are written once at the end (flush_stats). A pick
# writes its leases itself (flush_grants) before it reads them again; the call here only
# makes sure that nothing held back is ever dropped.
_BODY = (
    "local function body()\n{}\nend\nlocal result = body()\n"
    "flush_grants()\nflush_stats()\nreturn result\n"
)


@cache
def source(name: str) -> str:
    first, *rest = [(LUA_DIR / f"{part}.lua").read_text() for part in _PARTS[name]]
    if _PARTS[name][0] != "lib":
        return "\n".join((first, *rest))
    return first + "\n" + _BODY.format("\n".join(rest))


class ShardScript:
    """One script on one client. Not redis-py's Script: on NOSCRIPT that loads the script
    on every master of a cluster, which fails while any master is down, though the one
    holding this shard's slot is up. EVAL goes to the slot's node alone."""

    def __init__(self, connection: "redis.Redis | RedisCluster", text: str) -> None:
        self.connection = connection
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 (Redis's script id)

    def __call__(self, keys: Sequence[str], args: Sequence[object]) -> Any:
        try:
            return self.connection.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.connection.eval(self.text, len(keys), *keys, *args)


def register_all(connection: "redis.Redis | RedisCluster") -> dict[str, ShardScript]:
    return {name: ShardScript(connection, source(name)) for name in _PARTS}
