"""Real PostgreSQL servers with pgvector on 127.0.0.1, from the binaries the ``pgserver`` wheel ships.

For the retrieval tier's tests and benchmark (``genai_constructs.runtime.vector_store``, ``rag_orchestrator``): each
:class:`LocalPostgres` stands for one availability zone's reader. ``pgserver``'s own ``get_server`` listens on a Unix
socket only (``-h ""``); the retrieval client connects over TCP like it does to Aurora, so this starts the same
binaries with ``postgres -h 127.0.0.1 -p PORT`` instead. ``stop`` is an immediate shutdown (a zone's reader gone:
new connections are refused), ``start`` brings it back on the same port with its data.

PostgreSQL behaviour relied on: ``initdb --auth=trust`` lets local connections in without a password (initdb,
https://www.postgresql.org/docs/current/app-initdb.html); ``pg_ctl -w`` waits until the server accepts connections,
and ``stop -m immediate`` aborts every server process at once (pg_ctl,
https://www.postgresql.org/docs/current/app-pg-ctl.html).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["LocalPostgres", "free_port", "postgres_bin_dir"]

SYSTEM_USER_WHEN_ROOT = "pgserver"
"""PostgreSQL refuses to run as root ("initdb: cannot be run as root"); as root the servers run as the user pgserver
itself creates for the same reason."""
START_TIMEOUT_S = 30.0
"""A fresh cluster on a loaded two-core machine starts in about a second; thirty is room, not expectation."""


def postgres_bin_dir() -> Path:
    """The ``bin`` directory of the PostgreSQL (with pgvector) that the ``pgserver`` wheel ships.

    :raises ImportError: pgserver is not installed (``pip install pgserver``).
    """
    import pgserver  # noqa: F401 (the wheel's location is the point)

    path = Path(pgserver.__file__).resolve().parent / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise ImportError(f"pgserver is installed but ships no postgres binary under {path}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's choice of an ephemeral port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class LocalPostgres:
    """One PostgreSQL server on 127.0.0.1 with its own data directory; a context manager."""

    def __init__(self, data_dir: Path | None = None, *, port: int | None = None) -> None:
        self.bin_dir = postgres_bin_dir()
        self._owns_dir = data_dir is None
        self.root = Path(tempfile.mkdtemp(prefix="genai-pg-")) if data_dir is None else data_dir
        self.data_dir = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.system_user = SYSTEM_USER_WHEN_ROOT if os.geteuid() == 0 else None
        if self.system_user is not None:
            from pgserver.utils import ensure_user_exists

            ensure_user_exists(self.system_user)
            shutil.chown(self.root, self.system_user)
        if not self.data_dir.exists():
            self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions")

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([str(self.bin_dir / program), *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=START_TIMEOUT_S, user=self.system_user)

    @property
    def endpoint(self) -> str:
        """``HOST:PORT``, the form the retrieval client's ``--reader ZONE=HOST:PORT`` takes."""
        return f"{self.host}:{self.port}"

    @property
    def conninfo(self) -> str:
        return f"host={self.host} port={self.port} user=postgres dbname=postgres"

    def start(self) -> None:
        # -k '' : no Unix socket, so two servers never compete for /tmp/.s.PGSQL.<port>; TCP on loopback only.
        # fsync off: test data is rebuilt on every run, and a durable write is the slowest part of a load.
        options = f"-h {self.host} -p {self.port} -k '' -c fsync=off -c synchronous_commit=off -c max_connections=50"
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", str(int(START_TIMEOUT_S)), "-l", str(self.log_path),
                  "-o", options, "start")

    def stop(self) -> None:
        """Immediate shutdown: every backend ends now, as when a zone's reader is lost (idempotent)."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", "immediate", "stop")

    def close(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
