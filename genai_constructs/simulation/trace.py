"""Request traces and the traffic shapes the simulator replays them in.

A trace is any CSV with an arrival time (seconds, or timestamps such as the Azure LLM inference trace 2023's
``2023-11-16 18:15:46.6805900``), a prompt length and an output length, one request a row. The Azure traces
(Microsoft Azure, Azure Public Dataset, CC BY 4.0; columns ``TIMESTAMP,ContextTokens,GeneratedTokens``) cover about
one hour each, so a longer run repeats the trace end to end, keeping its mean gap between the copies.

Shapes (:data:`SCENARIOS`), applied after ``rate_scale`` compresses the trace's clock (x2 = twice the rate):

* ``steady``: the trace as it is;
* ``ramp``: the rate rises linearly from 0.2x to 1x over the run (deterministic thinning: each request is kept
  with the ramp's probability, by an accumulator rather than random draws, so runs are reproducible);
* ``burst``: 3x for 20 minutes in the middle of the run (two more copies of the trace, offset by a third and two
  thirds of its span, overlaid inside the window only);
* ``stop``: no traffic for two hours after the first hour;
* ``failure``: the trace as it is, and one instance wedges after the first hour (see the engine).
"""

from __future__ import annotations

import csv
import math
import os
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from genai_constructs.simulation.errors import ScenarioError, TraceReadError

SCENARIOS = ("steady", "ramp", "burst", "stop", "failure")
RAMP_START_FRACTION = 0.2
"""The ramp starts at a fifth of the trace's rate: low enough that the fleet sits at its minimum first."""
BURST_FACTOR = 3
"""A burst triples the rate: the ratio of peak to mean request rate seen in production LLM traces' busiest minutes
(the Azure 2023 conversation trace's busiest minute is ~1.8x its mean; 3x is the harsher test)."""
BURST_S = 20 * 60
"""A burst lasts 20 minutes: longer than a cold start (~7 min for an 8B model) plus the scaling delay, so the test
sees whether the fleet catches up inside it."""
STOP_AFTER_S = 3600
"""The stop scenario serves an hour before the traffic stops."""
STOP_S = 2 * 3600
"""...and stops for two hours: longer than target tracking's 15 minutes of low datapoints before scaling in."""
FAILURE_AFTER_S = 3600
"""The failure scenario wedges one instance an hour in, once the fleet is in a steady state."""

NAMED_TRACES = {
    "conv": "azure_llm_inference_2023_conv.csv",
    "code": "azure_llm_inference_2023_code.csv",
}
TRACES_ENV = "GENAI_CONSTRUCTS_TRACES"
"""A folder holding the named traces, when they are not in ``shared/traces`` beside the checkout."""

TIME_COLUMNS = ("timestamp", "arrival_time", "arrival_s", "arrival_time_s", "arrival", "time", "time_s")
PROMPT_COLUMNS = ("contexttokens", "prompt_tokens", "input_tokens", "context_tokens", "prompt")
OUTPUT_COLUMNS = ("generatedtokens", "output_tokens", "generated_tokens", "completion_tokens", "output")
_FRACTION = re.compile(r"(\.\d{6})\d+")


@dataclass(frozen=True)
class Trace:
    """Requests as read: arrival seconds from the first request, prompt and output tokens."""

    name: str
    arrivals: Sequence[float]
    prompts: Sequence[int]
    outputs: Sequence[int]

    @property
    def span_s(self) -> float:
        """The trace's length plus one mean gap, so that copies laid end to end keep the trace's rate."""
        n = len(self.arrivals)
        last = self.arrivals[-1]
        return last + (last / (n - 1) if n > 1 and last > 0 else 1.0)

    @property
    def rate_per_s(self) -> float:
        return len(self.arrivals) / self.span_s


@dataclass(frozen=True)
class Workload:
    """The request stream one run replays, sorted by arrival."""

    trace: str
    scenario: str
    duration_s: float
    rate_scale: float
    arrivals: array[float]
    prompts: array[int]
    outputs: array[int]
    burst: tuple[float, float] | None = None
    stop: tuple[float, float] | None = None
    wedge_at_s: float | None = None

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompts) / len(self.prompts) if self.prompts else 1.0

    @property
    def mean_output(self) -> float:
        return sum(self.outputs) / len(self.outputs) if self.outputs else 1.0


def resolve_trace(name: str) -> Path:
    """``conv``/``code`` to the Azure trace file, else the path as given."""
    if name not in NAMED_TRACES:
        return Path(name)
    file = NAMED_TRACES[name]
    here = Path(__file__).resolve()
    folders = [Path(os.environ[TRACES_ENV])] if os.environ.get(TRACES_ENV) else []
    folders += [here.parents[3] / "shared" / "traces", Path.cwd() / "shared" / "traces",
                Path.cwd().parent / "shared" / "traces"]
    for folder in folders:
        if (folder / file).is_file():
            return folder / file
    raise TraceReadError(f"trace {name}: {file} is not in {', '.join(str(f) for f in folders)}: pass the CSV's path "
                         f"with --trace, or set {TRACES_ENV} to the folder holding it")


def _column(header: list[str], names: tuple[str, ...]) -> int | None:
    lowered = [h.strip().lower() for h in header]
    for name in names:
        if name in lowered:
            return lowered.index(name)
    return None


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    return datetime.fromisoformat(_FRACTION.sub(r"\1", text.strip())).timestamp()


def read_trace(source: str | Path) -> Trace:
    """Read a trace CSV (see the module docstring).

    :raises TraceReadError: a missing file, a missing column, an unparseable or negative value, or no rows.
    """
    path = resolve_trace(str(source))
    try:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceReadError(f"trace {path} is empty: give a CSV with a header and one request a row")
            cols = [_column(header, names) for names in (TIME_COLUMNS, PROMPT_COLUMNS, OUTPUT_COLUMNS)]
            missing = [what for what, col in zip(("an arrival time (TIMESTAMP or arrival_s)",
                                                  "prompt tokens (ContextTokens or prompt_tokens)",
                                                  "output tokens (GeneratedTokens or output_tokens)"), cols, strict=True)
                       if col is None]
            if missing:
                raise TraceReadError(f"trace {path} lacks a column for {' and '.join(missing)}: its header is "
                                     f"{','.join(header)}")
            t_col, p_col, o_col = (c for c in cols if c is not None)
            rows: list[tuple[float, int, int]] = []
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                try:
                    t, p, o = _seconds(row[t_col]), int(row[p_col]), int(row[o_col])
                except (ValueError, IndexError):
                    raise TraceReadError(f"trace {path} line {line}: {','.join(row)!r} does not hold an arrival time "
                                         "and two whole token counts") from None
                if p < 0 or o < 0:
                    raise TraceReadError(f"trace {path} line {line}: token counts must be >= 0, got prompt {p} and "
                                         f"output {o}")
                if not math.isfinite(t):
                    raise TraceReadError(f"trace {path} line {line}: arrival time {row[t_col]!r} is not finite")
                rows.append((t, p, o))
    except FileNotFoundError:
        raise TraceReadError(f"trace {path} does not exist: give conv, code or the path of a CSV") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TraceReadError(f"trace {path} cannot be read ({error}): give a CSV file") from None
    if not rows:
        raise TraceReadError(f"trace {path} has a header but no requests")
    rows.sort()
    start = rows[0][0]
    # A server emits at least one token for every request it accepts, so a recorded 0 is served as 1.
    return Trace(name=path.stem, arrivals=[t - start for t, _, _ in rows], prompts=[p for _, p, _ in rows],
                 outputs=[max(1, o) for _, _, o in rows])


def _tiled(trace: Trace, rate_scale: float, offset_s: float, start_s: float, end_s: float
           ) -> tuple[list[float], list[int], list[int]]:
    """The trace at ``rate_scale``, repeated end to end from ``-offset_s``, cut to ``[start_s, end_s)``."""
    span = trace.span_s / rate_scale
    arrivals, prompts, outputs = trace.arrivals, trace.prompts, trace.outputs
    times: list[float] = []
    ps: list[int] = []
    os_: list[int] = []
    copy = math.floor((start_s + offset_s) / span)
    scaled = [t / rate_scale for t in arrivals]
    while True:
        base = copy * span - offset_s
        if base >= end_s:
            break
        for i, t in enumerate(scaled):
            at = base + t
            if at < start_s:
                continue
            if at >= end_s:
                break
            times.append(at)
            ps.append(prompts[i])
            os_.append(outputs[i])
        copy += 1
    return times, ps, os_


def build_workload(trace: Trace, *, hours: float, rate_scale: float = 1.0, scenario: str = "steady") -> Workload:
    """The request stream of ``scenario`` over ``hours`` at ``rate_scale`` times the trace's rate.

    :raises ScenarioError: an unknown scenario, a non-positive or non-finite rate scale or duration, or a run too
        short for its scenario (a burst needs more than 20 minutes, a stop or failure more than an hour).
    """
    if scenario not in SCENARIOS:
        raise ScenarioError(f"scenario {scenario!r} does not exist: choose one of {', '.join(SCENARIOS)}")
    for name, value in (("rate scale", rate_scale), ("hours", hours)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ScenarioError(f"{name} must be a positive finite number, got {value!r}")
    duration = hours * 3600.0
    if scenario == "burst" and duration <= BURST_S:
        raise ScenarioError(f"the burst scenario needs more than {BURST_S // 60} minutes: raise --hours")
    if scenario in ("stop", "failure") and duration <= STOP_AFTER_S:
        raise ScenarioError(f"the {scenario} scenario starts after the first hour: give --hours above 1")
    times, prompts, outputs = _tiled(trace, rate_scale, 0.0, 0.0, duration)
    burst = stop = None
    wedge = None
    if scenario == "ramp":
        keep_t: list[float] = []
        keep_p: list[int] = []
        keep_o: list[int] = []
        acc = 0.0
        for t, p, o in zip(times, prompts, outputs, strict=True):
            acc += RAMP_START_FRACTION + (1 - RAMP_START_FRACTION) * t / duration
            if acc >= 1.0:
                acc -= 1.0
                keep_t.append(t)
                keep_p.append(p)
                keep_o.append(o)
        times, prompts, outputs = keep_t, keep_p, keep_o
    elif scenario == "burst":
        burst = (duration / 2 - BURST_S / 2, duration / 2 + BURST_S / 2)
        span = trace.span_s / rate_scale
        rows = list(zip(times, prompts, outputs, strict=True))
        for copy in range(1, BURST_FACTOR):
            extra = _tiled(trace, rate_scale, copy * span / BURST_FACTOR, burst[0], burst[1])
            rows.extend(zip(*extra, strict=True))
        rows.sort()
        times, prompts, outputs = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    elif scenario == "stop":
        stop = (float(STOP_AFTER_S), float(min(duration, STOP_AFTER_S + STOP_S)))
        kept = [i for i, t in enumerate(times) if not stop[0] <= t < stop[1]]
        times, prompts, outputs = [times[i] for i in kept], [prompts[i] for i in kept], [outputs[i] for i in kept]
    elif scenario == "failure":
        wedge = float(FAILURE_AFTER_S)
    return Workload(trace=trace.name, scenario=scenario, duration_s=duration, rate_scale=rate_scale,
                    arrivals=array("d", times), prompts=array("l", prompts), outputs=array("l", outputs),
                    burst=burst, stop=stop, wedge_at_s=wedge)


def rate_scale_for_peak_sessions(trace: Trace, sessions: float, ttft_ms: float, tpot_ms: float) -> float:
    """The rate scale at which the trace's busiest minute keeps ``sessions`` requests in flight on average.

    A request is in flight for its time to first token plus its output at ``tpot_ms`` per token (the plan's
    estimate), so a minute's concurrency is the sum of its requests' lifetimes over 60 s (Little's law).
    """
    per_minute: dict[int, float] = {}
    for t, o in zip(trace.arrivals, trace.outputs, strict=True):
        minute = int(t // 60)
        per_minute[minute] = per_minute.get(minute, 0.0) + (ttft_ms + o * tpot_ms) / 1000.0
    peak = max(per_minute.values()) / 60.0
    return sessions / peak
