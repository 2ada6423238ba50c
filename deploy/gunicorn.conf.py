"""gunicorn's configuration for the web processes (the Procfile's `web`; docs/DEPLOY.md).

Sized from docs/SCALING.md: a signed ingest request costs 1.2-1.3 ms of one core, and
`-w 2 --threads 4` answered 880-1,020 events/s on a 2-core machine with its databases
aboard. So one process per core (WEB_CONCURRENCY), four threads each (WEB_THREADS): the
threads cover the waits on PostgreSQL and Redis, the processes the CPU.
"""

import multiprocessing
import os

bind = os.environ.get("BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count()))
threads = int(os.environ.get("WEB_THREADS", "4"))
# A request is a body read (INGEST_MAX_BODY_BYTES) and a few queries: 30 s is a hung one.
timeout = int(os.environ.get("WEB_TIMEOUT", "30"))
# SIGTERM (a deploy, a scale-in): requests under way finish within this, then it exits.
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT", "30"))
keepalive = 5
# Behind a TLS-terminating proxy: the addresses allowed to set X-Forwarded-* (the proxy's).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
# One line per request is the proxy's job; set ACCESS_LOG=- to have gunicorn's too.
accesslog = os.environ.get("ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "warning")
