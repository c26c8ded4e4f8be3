"""A throwaway Postgres cluster of the test's own, to stop and restart mid-traffic.

Never the session's shared cluster: :class:`PostgresCluster` runs ``initdb`` into a
fresh directory under ``/tmp`` and serves on a Unix socket there (as ``.ci/run``
does; run as root, the server's programs run as the ``postgres`` user).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time

import pytest


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: [int(x) for x in p.split("/")[4].split(".") if x.isdigit()])
    return os.path.dirname(found[-1]) if found else None


class PostgresCluster:
    """``with PostgresCluster() as pg: pg.url; pg.stop(); pg.start(); pg.restart()``."""

    def __init__(self) -> None:
        bin_dir = _binaries()
        if bin_dir is None:
            problem = "no Postgres server programs in /usr/lib/postgresql/*/bin (.ci/run installs them)"
            if os.environ.get("CI", "").lower() in ("true", "1"):
                pytest.fail(problem)
            pytest.skip(problem)
        self.bin = bin_dir
        self.dir = tempfile.mkdtemp(prefix="backchannel-faults-pg-")
        self.data = os.path.join(self.dir, "data")
        self.url = f"postgresql://postgres@/postgres?host={self.dir}"
        self.log = os.path.join(self.dir, "log")

    def _run(self, program: str, *args: str) -> None:
        command = [os.path.join(self.bin, program), *args]
        if os.getuid() == 0:  # initdb and postgres refuse to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def __enter__(self) -> PostgresCluster:
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres")
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres")
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def start(self) -> float:
        """Start the server; returns the time (``time.monotonic()``) it accepted connections."""
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "start",
                  "-o", f"-k {self.dir} -c listen_addresses='' -c fsync=off -c max_connections=200")
        return time.monotonic()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (sessions cut, clean shutdown) or ``immediate`` (as if it crashed)."""
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> float:
        """Stop and start again at once; returns when it accepts connections."""
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-m", mode, "-w", "restart",
                  "-o", f"-k {self.dir} -c listen_addresses='' -c fsync=off -c max_connections=200")
        return time.monotonic()
