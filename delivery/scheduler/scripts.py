"""Load the Lua scripts once per client; redis-py then runs them by EVALSHA (falling back
to loading them if the server lost its script cache, e.g. after a restart)."""

from functools import cache
from pathlib import Path

import redis
from redis.commands.core import Script

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
# the counters lib.lua holds back are written once at the end (flush_stats).
_BODY = "local function body()\n{}\nend\nlocal result = body()\nflush_stats()\nreturn result\n"


@cache
def source(name: str) -> str:
    first, *rest = [(LUA_DIR / f"{part}.lua").read_text() for part in _PARTS[name]]
    if _PARTS[name][0] != "lib":
        return "\n".join((first, *rest))
    return first + "\n" + _BODY.format("\n".join(rest))


def register_all(connection: redis.Redis) -> dict[str, Script]:
    return {name: connection.register_script(source(name)) for name in _PARTS}
