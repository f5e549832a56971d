"""Helpers the runtime tests share for the real processes they start: a free local port, and waiting on a condition
with the processes' log tails in the failure (a timed-out wait says what the workers were doing)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], object], timeout_s: float, what: str, logs: list[Path]) -> None:
    """Poll ``condition`` every 0.1 s until it is true; after ``timeout_s``, fail naming ``what`` with the last
    3,000 characters of each log in ``logs``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}\n{tails}")
