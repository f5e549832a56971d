"""``genai-constructs``: plan and estimate from the command line (readable tables, or ``--json``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner import RUNTIMES, estimate, plan_embedding, plan_inference
from genai_constructs.planner.plans import EmbeddingPlan, Estimate, InferencePlan
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic

DEMO_WORKLOADS: list[tuple[str, str, Any]] = [
    ("8B chat", "llama-3.1-8b", RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)),
    ("70B chat", "llama-3.1-70b", RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=15)),
    (
        "Batch embedding",
        "bge-large-en-v1.5",
        BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True),
    ),
]


def _model(args: argparse.Namespace) -> ModelShape:
    return ModelShape.preset(args.model, precision=args.precision)


def _plan_table(title: str, plan: InferencePlan | EmbeddingPlan) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("model", f"{plan.model.name} ({plan.model.precision.value})")
    table.add_row("instance", f"{plan.instance_type} ({plan.accelerator})")
    if isinstance(plan, InferencePlan):
        e = plan.estimate
        table.add_row("tensor-parallel devices", str(plan.devices_per_replica))
        table.add_row("instances (min / max)", f"{plan.min_instances} / {plan.max_instances}")
        table.add_row("concurrency per instance", str(plan.concurrency_per_instance))
        table.add_row("TPOT / TTFT", f"{e.tpot_ms:.1f} ms / {e.ttft_ms:.0f} ms")
        table.add_row("tokens/s per instance", f"{e.output_tokens_per_s:,.0f}")
        table.add_row("$/hour (one / peak)", f"{_usd(plan.usd_per_hour)} / {_usd(plan.usd_per_hour_at_peak)}")
        table.add_row("$ per 1M output tokens", _usd(plan.usd_per_million_output_tokens))
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
        table.add_row("hours to finish", f"{plan.hours_to_finish:.1f}")
        table.add_row("$/hour per instance", _usd(plan.usd_per_hour))
        table.add_row("$ per 1M tokens", _usd(plan.usd_per_million_tokens, digits=4))
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


def _cmd_plan(args: argparse.Namespace, console: Console) -> int:
    model = _model(args)
    plan: InferencePlan | EmbeddingPlan
    if model.kind == "encoder":
        if args.documents is None or args.tokens_per_document is None or args.deadline_hours is None:
            raise GenaiConstructsError(
                "plan: an encoder needs --documents, --tokens-per-document and --deadline-hours (batch traffic)"
            )
        traffic = BatchTraffic(
            documents=args.documents,
            tokens_per_document=args.tokens_per_document,
            deadline_hours=args.deadline_hours,
            spot_ok=args.spot,
        )
        plan = plan_embedding(model, traffic, include_neuron=args.include_neuron)
    else:
        if args.sessions is None or args.tokens_per_s is None:
            raise GenaiConstructsError("plan: a decoder needs --sessions and --tokens-per-s (real-time traffic)")
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
        plan = plan_inference(model, realtime, include_neuron=args.include_neuron)
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        console.print(_plan_table(f"Plan for {model.name}", plan))
    return 0


def _cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    e = estimate(
        _model(args),
        args.instance,
        devices=args.devices,
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens or 128,
        output_tokens=args.output_tokens or 128,
        runtime=args.runtime,
    )
    if args.json:
        print(e.model_dump_json(indent=2))
    else:
        console.print(_estimate_table(e))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genai-constructs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", required=True, help="a preset name, e.g. llama-3.1-8b or bge-large-en-v1.5")
        p.add_argument("--precision", default=None, help="override the preset's precision (fp8, int4, ...)")
        p.add_argument("--prompt-tokens", type=int, default=None)
        p.add_argument("--output-tokens", type=int, default=None)
        p.add_argument("--json", action="store_true", help="machine-readable output")

    plan = sub.add_parser("plan", help="choose instance type and fleet size for a workload")
    model_args(plan)
    plan.add_argument("--sessions", type=int, help="concurrent real-time sessions at peak")
    plan.add_argument("--tokens-per-s", type=float, help="output tokens/s each session needs")
    plan.add_argument("--p95-ttft-ms", type=float)
    plan.add_argument("--p95-tpot-ms", type=float)
    plan.add_argument(
        "--max-request-tokens", type=int, help="longest prompt + output one request may carry (vLLM --max-model-len)"
    )
    plan.add_argument("--documents", type=int, help="batch: documents in the backlog")
    plan.add_argument("--tokens-per-document", type=int)
    plan.add_argument("--deadline-hours", type=float)
    plan.add_argument("--spot", action="store_true", help="batch: Spot capacity is acceptable")
    plan.add_argument("--include-neuron", action="store_true", help="let Inferentia2/Trainium compete")
    plan.set_defaults(func=_cmd_plan)

    est = sub.add_parser("estimate", help="predict TPOT, TTFT, throughput and memory on one instance type")
    model_args(est)
    est.add_argument("--instance", required=True, help="EC2 instance type, e.g. g5.2xlarge")
    est.add_argument("--devices", type=int, default=None, help="tensor-parallel devices (default: all)")
    est.add_argument("--concurrency", type=int, default=1)
    est.add_argument("--runtime", default="vllm", choices=sorted(RUNTIMES))
    est.set_defaults(func=_cmd_estimate)

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


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["enqueue"]:
        # enqueue owns its whole argument list (argparse.REMAINDER would not pass a leading --help through).
        return _cmd_enqueue(argparse.Namespace(enqueue_args=argv[1:]), console)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args, console))
    except GenaiConstructsError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
