"""``genai-constructs``: plan and estimate from the command line (readable tables, or ``--json``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner import RUNTIMES, estimate, plan_embedding, plan_inference
from genai_constructs.planner.plans import EmbeddingPlan, Estimate, InferencePlan
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic, list_presets

DEMO_WORKLOADS: list[tuple[str, str, Any]] = [
    ("8B chat", "llama-3.1-8b", RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)),
    ("70B chat", "llama-3.1-70b", RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=15)),
    (
        "Batch embedding",
        "bge-large-en-v1.5",
        BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True),
    ),
]


DEFAULT_ESTIMATE_TOKENS = 128
"""Prompt and output length of ``estimate`` when not given: a short exchange, so the figure is the decode speed."""


def _model(args: argparse.Namespace) -> ModelShape:
    if args.hf_config is not None:
        return ModelShape.from_hf_config(args.hf_config, precision=args.precision)
    return ModelShape.preset(args.model, precision=args.precision)


def _plan_table(title: str, plan: InferencePlan | EmbeddingPlan) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("model", f"{plan.model.name} ({plan.model.precision.value})")
    table.add_row("instance", f"{plan.instance_type} ({plan.accelerator})")
    if isinstance(plan, InferencePlan):
        e = plan.estimate
        table.add_row(
            "replicas x tensor-parallel devices", f"{plan.replicas_per_instance} x {plan.devices_per_replica}"
        )
        table.add_row("instances (min / max)", f"{plan.min_instances} / {plan.max_instances}")
        table.add_row("concurrency per instance", str(plan.concurrency_per_instance))
        table.add_row("TPOT / TTFT", f"{e.tpot_ms:.1f} ms / {e.ttft_ms:.0f} ms")
        table.add_row("tokens/s per instance", f"{e.output_tokens_per_s * plan.replicas_per_instance:,.0f}")
        for warning in e.warnings:
            table.add_row("estimate warning", warning)
        table.add_row("price", plan.price_label or "n/a")
        table.add_row("$/hour (one / all instances)", f"{_usd(plan.usd_per_hour)} / {_usd(plan.usd_per_hour_at_peak)}")
        table.add_row("$ per 1M output tokens at capacity", _usd(plan.usd_per_million_output_tokens))
        cost = plan.cost_at_traffic
        if cost is not None:
            table.add_row("$/hour as deployed at this traffic", f"{_usd(cost.usd_per_hour)} (items under 'why')")
            table.add_row("$ per 1M output tokens at this traffic", _usd(cost.usd_per_million_output_tokens_at_traffic))
        if plan.spot_usd_per_hour is not None:
            table.add_row("Spot estimate (one instance)", f"{_usd(plan.spot_usd_per_hour)}: {plan.spot_price_label}")
        server = plan.server
        table.add_row("server settings (vLLM)", " ".join(server.vllm_args()))
        table.add_row(
            "KV cache at max_model_len",
            f"{server.kv_cache_gib_one_max_request:.2f} GiB per request of {server.kv_cache_gib_available:.2f} GiB "
            f"left ({server.kv_cache_gib_reserved:.2f} GiB kept back): {server.max_concurrent_max_requests} at once",
        )
    else:
        table.add_row("workers per instance", str(plan.workers_per_instance))
        table.add_row("instances (min / max)", f"{plan.min_instances} / {plan.max_instances}")
        table.add_row("tokens/s per instance", f"{plan.tokens_per_s_per_instance:,.0f}")
        table.add_row(
            "hours to finish", f"{plan.hours_to_finish:.1f} (worker start-up {plan.worker_startup_s / 60:.0f} min)"
        )
        table.add_row("price", plan.price_label or "n/a")
        table.add_row("$/hour per instance", _usd(plan.usd_per_hour))
        table.add_row("$ per 1M tokens (compute)", _usd(plan.usd_per_million_tokens, digits=4))
        if plan.job_cost is not None:
            table.add_row(
                "whole job",
                f"{_usd(plan.job_cost.total_usd)} over {plan.job_cost.hours_wall_clock:.2f} h "
                f"({_usd(plan.job_cost.usd_per_million_tokens, digits=4)} per 1M tokens all in; "
                f"{plan.job_cost.instance_price_label})",
            )
        table.add_row("Spot", ", ".join(plan.spot_instance_types) if plan.spot else "no")
    table.add_row("bottleneck", plan.bottleneck)
    table.add_row("cost lever", plan.cost_lever)
    for i, reason in enumerate(plan.reasons):
        table.add_row("why" if i == 0 else "", reason)
    for caveat in plan.neuron_caveats:
        table.add_row("Neuron", caveat)
    alternatives = ", ".join(
        f"{a.instance_type} x{a.instances} ({_usd(a.usd_per_million_tokens, digits=4)}/1M)" for a in plan.alternatives
    )
    table.add_row("alternatives", alternatives or "none")
    for note in plan.notes:
        table.add_row("note", note)
    return table


def _usd(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"${value:,.{digits}f}"


def _estimate_table(e: Estimate) -> Table:
    table = Table(
        title=f"{e.model_name} on {e.instance_type} ({e.devices} device(s), {e.runtime})", title_justify="left"
    )
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("concurrency", f"{e.concurrency}"),
        ("TPOT", f"{e.tpot_ms:.2f} ms"),
        ("TTFT (unloaded)", f"{e.ttft_ms:.1f} ms"),
        ("output tokens/s (all sequences)", f"{e.output_tokens_per_s:,.1f}"),
        ("roofline TPOT", f"{e.roofline_tpot_ms:.2f} ms"),
        ("bound", e.bound),
        ("weights", f"{e.memory.weights_gib:.1f} GiB"),
        ("KV cache", f"{e.memory.kv_cache_gib:.2f} GiB"),
        ("runtime overhead", f"{e.memory.runtime_overhead_gib:.1f} GiB"),
        ("free", f"{e.memory.free_gib:.1f} GiB of {e.memory.total_gib:.1f}"),
        ("max concurrency in memory", f"{e.memory.max_concurrency}"),
    ] + [(f"step term: {k}", f"{v:.3f} ms") for k, v in e.terms_ms.items()]
    for name, value in rows:
        table.add_row(name, value)
    return table


_REALTIME_FLAGS = ("sessions", "tokens_per_s", "p95_ttft_ms", "p95_tpot_ms", "max_request_tokens")
_BATCH_FLAGS = ("documents", "tokens_per_document", "deadline_hours", "spot")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    return [_flag(n) for n in names if getattr(args, n, None) not in (None, False)]


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    model = _model(args)
    plan: InferencePlan | EmbeddingPlan
    if model.kind == "encoder":
        problems = []
        missing = [_flag(n) for n in ("documents", "tokens_per_document", "deadline_hours") if getattr(args, n) is None]
        if missing:
            problems.append(f"an encoder ({model.name}) plans batch traffic and needs {', '.join(missing)}")
        stray = _given(args, _REALTIME_FLAGS) + _given(args, ("prompt_tokens", "output_tokens"))
        if stray:
            problems.append(
                f"{', '.join(stray)} describe real-time decoder traffic and do not apply to an encoder: drop them"
            )
        if problems:
            raise GenaiConstructsError("plan: " + "; ".join(problems))
        traffic = BatchTraffic(
            documents=args.documents,
            tokens_per_document=args.tokens_per_document,
            deadline_hours=args.deadline_hours,
            spot_ok=args.spot,
        )
        plan = plan_embedding(model, traffic, include_neuron=args.include_neuron, region=args.region)
    else:
        problems = []
        missing = [_flag(n) for n in ("sessions", "tokens_per_s") if getattr(args, n) is None]
        if missing:
            problems.append(f"a decoder ({model.name}) plans real-time traffic and needs {', '.join(missing)}")
        stray = _given(args, _BATCH_FLAGS)
        if stray:
            problems.append(
                f"{', '.join(stray)} describe batch embedding traffic and do not apply to a decoder: drop them"
            )
        if problems:
            raise GenaiConstructsError("plan: " + "; ".join(problems))
        extra = {
            k: v
            for k, v in (
                ("prompt_tokens", args.prompt_tokens),
                ("output_tokens", args.output_tokens),
                ("p95_ttft_ms", args.p95_ttft_ms),
                ("p95_tpot_ms", args.p95_tpot_ms),
                ("max_request_tokens", args.max_request_tokens),
            )
            if v is not None
        }
        realtime = RealtimeTraffic(
            concurrent_sessions=args.sessions, output_tokens_per_s_per_session=args.tokens_per_s, **extra
        )
        plan = plan_inference(model, realtime, include_neuron=args.include_neuron, region=args.region)
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        console.print(_plan_table(f"Plan for {model.name}", plan))
    return 0


def _cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    model = _model(args)
    stray = _given(args, ("sessions",))
    if stray:
        raise GenaiConstructsError(f"estimate: {', '.join(stray)} is a plan flag; use --concurrency")
    e = estimate(
        model,
        args.instance,
        devices=args.devices,
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens or DEFAULT_ESTIMATE_TOKENS,
        output_tokens=args.output_tokens or DEFAULT_ESTIMATE_TOKENS,
        runtime=args.runtime,
    )
    if args.json:
        print(e.model_dump_json(indent=2))
    else:
        console.print(_estimate_table(e))
    if not e.fits:
        # The numbers are shown (they say by how much), but a workload that does not fit is not a success.
        needed = e.memory.weights_gib + e.memory.runtime_overhead_gib + e.memory.kv_cache_gib
        raise GenaiConstructsError(
            f"estimate: {model.name} ({model.precision.value}) at concurrency {e.concurrency} needs {needed:.1f} GiB "
            f"on {e.devices} device(s) of {e.instance_type}, which have {e.memory.total_gib:.1f} GiB: use more "
            "--devices, a larger --instance, a lower --concurrency or a narrower --precision"
        )
    return 0


def _cmd_models(args: argparse.Namespace, console: Console) -> int:
    rows = list_presets()
    if args.json:
        print(json.dumps([row.model_dump() if hasattr(row, "model_dump") else dict(row) for row in rows], indent=2))
        return 0
    table = Table(title="Model presets (ModelShape.preset(name); --model name)", title_justify="left")
    for column in ("name", "kind", "parameters (B)", "active (B)", "precision", "max context", "source"):
        table.add_column(column)
    for row in rows:
        item = row.model_dump() if hasattr(row, "model_dump") else dict(row)
        active = item.get("active_parameters_billion")
        table.add_row(
            str(item["name"]),
            str(item["kind"]),
            f"{item['parameters_billion']:g}",
            "" if active is None else f"{active:g}",
            str(item["precision"]),
            f"{item['max_context']:,}",
            str(item.get("source", "")),
        )
    console.print(table)
    return 0


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    for title, model_name, traffic in DEMO_WORKLOADS:
        model = ModelShape.preset(model_name)
        plan = (
            plan_inference(model, traffic) if isinstance(traffic, RealtimeTraffic) else plan_embedding(model, traffic)
        )
        console.print(_plan_table(f"{title}: {model_name}", plan))
        console.print()
    return 0


def _cmd_enqueue(args: argparse.Namespace, console: Console) -> int:
    from genai_constructs.runtime import enqueue  # boto3 lives in the worker extra: import only when asked

    return int(enqueue.main(args.enqueue_args))


def _cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    from genai_constructs.simulation.cli import run_simulate  # the simulator loads only when asked

    return run_simulate(args)


class _UsageError(Exception):
    """A command line argparse refused; shown as one sentence (JSON under --json), never argparse's exit."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse calls this and expects it not to return
        raise _UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _positive_int(flag: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive whole number, got {text!r}")
        return value

    return parse


def _positive_float(flag: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number > 0, got {text!r}")
        return value

    return parse


def _version() -> str:
    try:
        return metadata.version("genai-constructs")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="genai-constructs", description=__doc__)
    parser.add_argument("--version", action="version", version=f"genai-constructs {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def model_args(p: argparse.ArgumentParser) -> None:
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("--model", help="a preset name, e.g. llama-3.1-8b or bge-large-en-v1.5 (see: models)")
        source.add_argument(
            "--hf-config",
            metavar="PATH",
            help="a Hugging Face config.json (or the folder holding it) instead of a preset",
        )
        p.add_argument("--precision", default=None, help="override the model's precision (fp8, int4, ...)")
        p.add_argument("--prompt-tokens", type=_positive_int("--prompt-tokens"), default=None)
        p.add_argument("--output-tokens", type=_positive_int("--output-tokens"), default=None)
        p.add_argument("--json", action="store_true", help="machine-readable output (errors too)")

    plan = sub.add_parser("plan", help="choose instance type and fleet size for a workload")
    model_args(plan)
    plan.add_argument("--sessions", type=_positive_int("--sessions"), help="concurrent real-time sessions at peak")
    plan.add_argument(
        "--tokens-per-s", type=_positive_float("--tokens-per-s"), help="output tokens/s each session needs"
    )
    plan.add_argument("--p95-ttft-ms", type=_positive_float("--p95-ttft-ms"))
    plan.add_argument("--p95-tpot-ms", type=_positive_float("--p95-tpot-ms"))
    plan.add_argument(
        "--max-request-tokens",
        type=_positive_int("--max-request-tokens"),
        help="longest prompt + output one request may carry (vLLM --max-model-len)",
    )
    plan.add_argument("--documents", type=_positive_int("--documents"), help="batch: documents in the backlog")
    plan.add_argument("--tokens-per-document", type=_positive_int("--tokens-per-document"))
    plan.add_argument("--deadline-hours", type=_positive_float("--deadline-hours"))
    plan.add_argument("--spot", action="store_true", help="batch: Spot capacity is acceptable")
    plan.add_argument("--include-neuron", action="store_true", help="let Inferentia2/Trainium compete")
    plan.add_argument(
        "--region", default=None, help="AWS region to price and check availability in (default: us-east-1 prices)"
    )
    plan.set_defaults(func=_cmd_plan)

    est = sub.add_parser("estimate", help="predict TPOT, TTFT, throughput and memory on one instance type")
    model_args(est)
    est.add_argument("--instance", required=True, help="EC2 instance type, e.g. g5.2xlarge")
    est.add_argument(
        "--devices", type=_positive_int("--devices"), default=None, help="tensor-parallel devices (default: all)"
    )
    est.add_argument("--concurrency", type=_positive_int("--concurrency"), default=1)
    est.add_argument("--runtime", default="vllm", choices=sorted(RUNTIMES))
    est.set_defaults(func=_cmd_estimate)

    models = sub.add_parser("models", help="list the model presets")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    models.set_defaults(func=_cmd_models)

    demo = sub.add_parser("demo", help="print plans for sample workloads")
    demo.set_defaults(func=_cmd_demo)

    enq = sub.add_parser("enqueue", help="batch existing S3 keys into queue messages (see --help)", add_help=False)
    enq.add_argument("enqueue_args", nargs=argparse.REMAINDER)
    enq.set_defaults(func=_cmd_enqueue)

    from genai_constructs.simulation.cli import add_simulate_arguments

    sim = sub.add_parser("simulate", help="replay a request trace through a synthesized fleet's own scaling rules")
    add_simulate_arguments(sim)
    sim.set_defaults(func=_cmd_simulate)
    return parser


def _fail(message: str, kind: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"error": {"type": kind, "message": message}}, indent=2))
    else:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["enqueue"]:
        # enqueue owns its whole argument list (argparse.REMAINDER would not pass a leading --help through).
        return _cmd_enqueue(argparse.Namespace(enqueue_args=argv[1:]), console)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as error:
        return _fail(str(error), "UsageError", as_json)
    try:
        return int(args.func(args, console))
    except GenaiConstructsError as error:
        return _fail(str(error), type(error).__name__, as_json)


if __name__ == "__main__":
    sys.exit(main())
