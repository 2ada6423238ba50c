"""The one-call command packer writes exactly what redis-py would, and every client
connect() makes uses it."""

import pytest
import redis
from redis._parsers import Encoder
from redis.connection import PythonRespSerializer

from core import redis_connection
from core.redis_packing import CommandPacker

# redis-py's own packing, argument by argument in Python: the reference.
_REFERENCE = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)

COMMANDS = [
    ("SET", "key", "value"),
    ("FCALL", "wh_f", 1, "wh:{0}:stats", "wh:{0}:", "-1.0", "fair", 0, -7, 2**70),
    ("SET", b"bytes-key", b"\x00\xff binary"),
    ("SET", "k", 0.1, 1e20, float("inf"), -0.0, 1 / 3),
    ("SET", "naïve ☃", "ünïcode"),
    ("CLIENT SETNAME", "several-words"),
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", bytearray(b"array")),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", "x" * 10_000),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: repr(command)[:40])
def test_packs_the_same_bytes_as_redis_py(command):
    assert b"".join(CommandPacker().pack(*command)) == b"".join(_REFERENCE.pack(*command))


@pytest.mark.parametrize("bad", [True, None, object()])
def test_what_redis_py_refuses_is_refused_the_same_way(bad):
    with pytest.raises(redis.DataError):
        _REFERENCE.pack("SET", "k", bad)
    with pytest.raises(redis.DataError):
        CommandPacker().pack("SET", "k", bad)


def _packer_of(client) -> object:
    pool = client.connection_pool if isinstance(client, redis.Redis) else None
    if pool is None:  # a cluster: each master's own pool
        pool = client.get_primaries()[0].redis_connection.connection_pool
    connection = pool.get_connection()
    try:
        return connection._command_packer
    finally:
        pool.release(connection)


def test_clients_of_both_kinds_pack_with_it_and_work(settings, redis_cluster):
    plain = redis_connection.connect(settings.REDIS_URL)
    cluster = redis_connection.connect(redis_cluster.url)
    try:
        for client in (plain, cluster):
            assert isinstance(_packer_of(client), CommandPacker)
            client.set("wh:test-packing:☃", 2.5)
            assert client.get("wh:test-packing:☃") == b"2.5"
            assert client.incrbyfloat("wh:test-packing:☃", 1) == 3.5
            client.delete("wh:test-packing:☃")
        plain.client_setname("packing-test")  # a command name of two words
        assert plain.client_getname() == "packing-test"
    finally:
        plain.close()
        cluster.close()


def test_a_url_with_another_encoding_keeps_redis_pys_packing(settings):
    joiner = "&" if "?" in settings.REDIS_URL else "?"
    client = redis_connection.connect(settings.REDIS_URL + joiner + "encoding=latin-1")
    try:
        assert not isinstance(_packer_of(client), CommandPacker)
        client.set("wh:test-packing:latin", "é")
        assert client.get("wh:test-packing:latin") == "é".encode("latin-1")
        client.delete("wh:test-packing:latin")
    finally:
        client.close()
