"""What one health probe costs the web process: /healthz and /readyz through the production
WSGI application (project.machine_doors), against a real database and Redis, side by
side in one process. A script, not a test:

    REDIS_URL=redis://127.0.0.1:6379/0 [DATABASE_URL=postgres://...] \\
        .venv/bin/python bench/probes.py [--probes 500]

Why it exists: an orchestrator probes every web process every second or so; a probe must
cost next to nothing beside the traffic it guards (docs/BENCHMARKS.md).
"""

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--probes", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import call_command

    from project.machine_doors import get_wsgi_application

    app = get_wsgi_application()
    call_command("migrate", verbosity=0)

    def probe(path: str) -> bytes:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": path,
            "SERVER_NAME": "10.0.0.7",
            "SERVER_PORT": "8000",
            "wsgi.input": io.BytesIO(),
            "wsgi.url_scheme": "http",
        }
        return b"".join(app(environ, lambda status, headers: None))

    results = {"answer": json.loads(probe("/readyz"))}
    for path in ("/healthz", "/readyz"):
        started = time.perf_counter()
        for _ in range(args.probes):
            probe(path)
        results[f"{path[1:]}_us"] = round((time.perf_counter() - started) / args.probes * 1e6, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
