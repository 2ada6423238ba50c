"""The process's Redis clients for the platform's own keys, configured from settings when
first used: `shared()` for REDIS_URL (RQ's neighbours: the workers' maintenance locks, the
fairness-key counts, the dashboards' status memory), `scheduler()` for SCHEDULER_REDIS_URL
(the schedule), which may be a Redis Cluster.

One client per URL means one connection pool per process, whichever app asks first; apps at
any layer may use them, so none of them reaches up into the scheduler's package for a socket.
"""

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from core.redis_packing import ENCODING, CommandPacker, PackingConnection

# Every key the platform writes starts with this: the scheduler's `wh:{<shard>}:` (the
# braces are a Redis Cluster hash tag), everything else `wh:<area>:`.
KEY_PREFIX = "wh:"
# `redis+cluster://[user:password@]host:port,host:port[?socket_timeout=..]`: seed nodes of
# a Redis Cluster. Any one reachable seed is enough; the client learns the slot map from it.
CLUSTER_SCHEME = "redis+cluster"
CLUSTER_OPTIONS = {"socket_timeout": float, "socket_connect_timeout": float}

# A cluster command that meets a dead master is retried this often, briefly, then fails:
# the callers ride out a failover themselves (a worker backs off and picks again, ingest
# flags the deliveries for the sweeper), while a shard still up is not held up behind it.
# redis-py's default (3 retries, backoff up to 10 s) would hold every pick for seconds
# behind a dead master (docs/SCHEDULER.md).
CLUSTER_RETRIES = 2

Client = redis.Redis | RedisCluster
_clients: dict[str, Client] = {}


def without_password(url: str) -> str:
    """`url` fit to print: a password before the `@` (of any of these URLs) is masked."""
    parts = urlsplit(url)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME + "://")


def cluster_seeds(url: str) -> list[ClusterNode]:
    """The seed nodes of a redis+cluster:// URL; ValueError names what is wrong."""
    parts = urlsplit(url)
    seeds = []
    for address in filter(None, parts.netloc.rpartition("@")[2].split(",")):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{address!r} in {url!r} is not host:port")
        seeds.append(ClusterNode(host.strip("[]"), int(port)))
    if not seeds:
        raise ValueError(f"{url!r} names no seed node (host:port, comma-separated)")
    if parts.path not in ("", "/", "/0"):
        raise ValueError(f"{url!r}: a Redis Cluster has database 0 only")
    return seeds


def check_url(url: str) -> None:
    """ValueError unless `url` is one connect() takes (for settings, at start-up)."""
    if is_cluster_url(url):
        cluster_seeds(url)
        cluster_options(url)
    elif not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{url!r}: expected redis://, rediss://, unix:// or {CLUSTER_SCHEME}://")


def cluster_options(url: str) -> dict[str, float | str]:
    """The client options in a redis+cluster:// URL: the query's timeouts, and the
    credentials before the `@`, read as redis-py reads a redis:// URL's (`user:password`,
    `:password`, percent-decoded)."""
    options: dict[str, float | str] = {}
    credentials, at, _ = urlsplit(url).netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    if at and username:
        options["username"] = unquote(username)
    if at and password:
        options["password"] = unquote(password)
    for name, value in parse_qsl(urlsplit(url).query):
        if name not in CLUSTER_OPTIONS:
            raise ValueError(f"{url!r}: unknown option {name!r} (known: {sorted(CLUSTER_OPTIONS)})")
        options[name] = CLUSTER_OPTIONS[name](value)
    return options


def connect(
    url: str,
    *,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> Client:
    """A new client for `url`: redis://, rediss://, unix:// (one server) or
    redis+cluster:// (a Redis Cluster, MOVED/ASK and failovers handled by the client).
    Options in the URL itself (`?socket_timeout=`) win over the arguments. Commands are
    packed by core.redis_packing (one C call for plain arguments)."""
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
    }
    if not is_cluster_url(url):
        # The one-call packer writes UTF-8: a URL asking for another encoding goes without.
        encoding = dict(parse_qsl(urlsplit(url).query)).get("encoding", ENCODING)
        if encoding.lower().replace("_", "-") in (ENCODING, "utf8"):
            options["command_packer"] = CommandPacker()
        return redis.Redis.from_url(url, **options)
    return RedisCluster(
        startup_nodes=cluster_seeds(url),
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), CLUSTER_RETRIES),
        connection_class=PackingConnection,
        **(options | cluster_options(url)),
    )


def _client_for(url: str) -> Client:
    if url not in _clients:
        from django.conf import settings  # read when first used, not at import

        _clients[url] = connect(
            url,
            socket_timeout=getattr(settings, "REDIS_SOCKET_TIMEOUT", None),
            socket_connect_timeout=getattr(settings, "REDIS_CONNECT_TIMEOUT", None),
        )
    return _clients[url]


def shared() -> redis.Redis:
    """The client for settings.REDIS_URL (always one server: RQ needs one); options in the
    URL itself (`?socket_timeout=`) win over REDIS_SOCKET_TIMEOUT and REDIS_CONNECT_TIMEOUT."""
    from django.conf import settings

    return _client_for(settings.REDIS_URL)


def scheduler() -> Client:
    """The client for the schedule's keys: settings.SCHEDULER_REDIS_URL, which is
    REDIS_URL unless set (then the same client as shared())."""
    from django.conf import settings

    return _client_for(getattr(settings, "SCHEDULER_REDIS_URL", "") or settings.REDIS_URL)


def forget() -> None:
    """Drop the clients (tests that change settings, or after a fork)."""
    _clients.clear()
