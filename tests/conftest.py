"""Shared fixtures: a real Redis database of its own, and the real database via pytest-django."""

import os
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import redis

TEST_REDIS_DB = int(os.environ.get("TEST_REDIS_DB", "15"))
MARKER_KEY = "fairhooks:test-database"


def url_with_db(url: str, db: int) -> str:
    """The same Redis server, another logical database (works for redis:// and unix://)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{db}"))


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    test_url = url_with_db(settings.REDIS_URL, TEST_REDIS_DB)
    client = redis.Redis.from_url(test_url)
    if client.dbsize() and not client.exists(MARKER_KEY):
        pytest.exit(
            f"Redis database {TEST_REDIS_DB} at {settings.REDIS_URL} holds data that the tests "
            "did not write; refusing to flush it. Set TEST_REDIS_DB to an empty database.",
            returncode=3,
        )
    settings.REDIS_URL = test_url
    for queue in settings.RQ_QUEUES.values():
        queue["URL"] = test_url
    os.environ["REDIS_URL"] = test_url  # for worker subprocesses the tests start
    os.environ["TEST_REDIS_DB"] = str(TEST_REDIS_DB)


@pytest.fixture(autouse=True)
def redis_conn() -> redis.Redis:
    """A clean Redis database for every test (the schedule starts empty)."""
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.set(MARKER_KEY, "1")
    yield client
    client.close()
