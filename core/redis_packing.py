"""Packing a Redis command in one C call when its arguments allow it.

redis-py encodes every argument in Python (type checks, `str.encode`, a generator step)
before hiredis packs them, and an enqueue of a whole batch carries thousands of
arguments; `hiredis.pack_command` packs the same tuple at a fraction of the cost
(docs/INGEST.md). hiredis takes str, bytes, int and float itself and writes exactly the bytes
redis-py would (UTF-8 text, `repr` numbers), so a command made only of those goes to it
whole; anything else (bool and None, which redis-py refuses with DataError; bytearray;
a command name of several words) goes through redis-py's own packing, unchanged.
"""

from typing import Any

import hiredis
import redis
from redis._parsers import Encoder
from redis.connection import HiredisRespSerializer

# The encoding the fast path writes: hiredis encodes text as UTF-8, as redis-py does with
# its default options. A client made with another encoding does not get this packer.
ENCODING = "utf-8"


class CommandPacker:
    """A `command_packer` for redis-py connections (see the module's docstring)."""

    def __init__(self) -> None:
        encode = Encoder(ENCODING, "strict", False).encode
        self._general = HiredisRespSerializer(None, encode)

    def pack(self, *args: Any) -> list[bytes]:
        name = args[0]
        # redis-py splits a command name of several words ("CLIENT SETNAME") itself.
        if not (" " in name if isinstance(name, str) else b" " in name):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass  # an argument hiredis does not take: redis-py decides (DataError)
        return self._general.pack(*args)


class PackingConnection(redis.Connection):
    """A TCP connection that packs with CommandPacker: for a Redis Cluster's nodes, whose
    client passes a `connection_class` on but not a `command_packer`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", CommandPacker())
        super().__init__(**kwargs)
