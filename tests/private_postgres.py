"""A PostgreSQL server of a test's own (initdb in a temporary directory, run as the
`postgres` user, which PostgreSQL requires), so that a test may stop and start it."""

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.private_redis import free_port

RUN_AS = ["runuser", "-u", "postgres", "--"]


def available() -> bool:
    return bool(shutil.which("initdb") and shutil.which("pg_ctl") and shutil.which("runuser"))


class PrivatePostgres:
    def __init__(self) -> None:
        # Under /tmp itself: the `postgres` user must reach it (pytest's tmp_path is root's).
        self.home = Path(tempfile.mkdtemp(prefix="private-postgres-"))
        self.home.chmod(0o777)
        self.directory = self.home / "pgdata"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        subprocess.run(
            [*RUN_AS, "initdb", "-D", str(self.directory), "-A", "trust", "-U", "postgres"],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        # The server keeps whatever output it is given: a log file, never our pipes.
        log = self.home / "postgres.log"
        start = ["-o", options, "-l", str(log), "-w", "-t", "30", "start"]
        subprocess.run(
            [*RUN_AS, "pg_ctl", "-D", str(self.directory), *start],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """Gone at once (immediate shutdown), as a crashed or restarted server."""
        subprocess.run(
            [*RUN_AS, "pg_ctl", "-D", str(self.directory), "-m", "immediate", "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
