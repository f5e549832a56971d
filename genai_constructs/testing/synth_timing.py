"""Wall time of ``cdk synth`` for an app against an empty one-stack app: median of N runs each, and the ratio.

``python -m genai_constructs.testing.synth_timing`` (from the repository root) times the ``cdk.json`` app. Both
apps go through the same CLI, Node and jsii start-up, so the ratio isolates what the constructs and the nag packs
cost.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from genai_constructs.testing.emulator import LocalDeployError
from genai_constructs.testing.local_deploy import CLI_TIMEOUT_S, find_cdk_cli

DEFAULT_RUNS = 5
"""Median of five: one slow run (a cold disk cache) does not move it."""
EMPTY_APP = "from aws_cdk import App, Stack\napp = App()\nStack(app, 'Empty')\napp.synth()\n"
"""The baseline: one empty stack, same CLI, Node and jsii start-up."""


@dataclass(frozen=True)
class SynthTiming:
    app_seconds: list[float]
    empty_seconds: list[float]

    @property
    def app_median(self) -> float:
        return statistics.median(self.app_seconds)

    @property
    def empty_median(self) -> float:
        return statistics.median(self.empty_seconds)

    @property
    def ratio(self) -> float:
        return self.app_median / self.empty_median

    def render(self) -> str:
        runs = len(self.app_seconds)
        return (
            f"cdk synth, median of {runs}: app {self.app_median:.2f} s, empty one-stack app {self.empty_median:.2f} s, "
            f"ratio {self.ratio:.2f}x\n  app runs:   {', '.join(f'{s:.2f}' for s in self.app_seconds)}\n"
            f"  empty runs: {', '.join(f'{s:.2f}' for s in self.empty_seconds)}"
        )


def _time_synth(app: str, cwd: Path, env: dict[str, str]) -> float:
    out = tempfile.mkdtemp(prefix="cdk-synth-timing-")
    command = [*find_cdk_cli(cwd), "synth", "--app", app, "--output", out, "--quiet", "--no-notices"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    seconds = time.monotonic() - started
    findings_only = "finished with errors" in done.stdout + done.stderr  # nag findings: synthesis still ran in full
    if done.returncode != 0 and not findings_only:
        raise LocalDeployError(f"cdk synth failed: {shlex.join(command)}\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds


def measure(app: str, *, runs: int = DEFAULT_RUNS, cwd: Path | None = None) -> SynthTiming:
    """Time ``cdk synth`` of ``app`` and of an empty one-stack app, alternating, ``runs`` times each."""
    import os

    cwd = (cwd or Path.cwd()).resolve()
    scratch = Path(tempfile.mkdtemp(prefix="cdk-empty-app-"))
    (scratch / "empty_app.py").write_text(EMPTY_APP)
    empty = f"{shlex.quote(sys.executable)} {shlex.quote(str(scratch / 'empty_app.py'))}"
    env = dict(os.environ)
    env.update(
        CDK_HOME=str(scratch / "cdk-home"),
        CDK_DISABLE_VERSION_CHECK="1",
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    app_seconds, empty_seconds = [], []
    for _ in range(runs):
        app_seconds.append(_time_synth(app, cwd, env))
        empty_seconds.append(_time_synth(empty, cwd, env))
    return SynthTiming(app_seconds=app_seconds, empty_seconds=empty_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the synth timing of the cdk.json app (or --app) against an empty one-stack app."""
    parser = argparse.ArgumentParser(prog="python -m genai_constructs.testing.synth_timing", description=main.__doc__)
    parser.add_argument("--app", help="app command (default: cdk.json's app)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    args = parser.parse_args(argv)
    app = args.app or json.loads(Path("cdk.json").read_text())["app"]
    print(measure(app, runs=args.runs).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
