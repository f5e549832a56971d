"""Real documents of every format the preprocessing tier parses, made here (no binary fixtures in the repository).

``text_pdf`` writes a valid PDF 1.4 by hand (catalog, page tree, a Type 1 standard font, one content stream per page,
a cross-reference table with exact byte offsets: PDF 1.7, ISO 32000-1, 7.5), so pypdf reads it like any other
producer's file. The generators are shared by the tests and ``benchmarks/preprocess_throughput.py``.
"""

from __future__ import annotations

import json
import random
import textwrap

WORDS = ("the a of to and in is for on with as by at from that this which are be it or an was "
         "gpu spot queue vector batch encoder document chunk bucket prefix latency throughput retry worker "
         "interruption rebalance heartbeat visibility letter embedding model token cache retrieval aurora replica "
         "index search answer prompt context window parser graviton instance fleet scaling capacity region zone "
         "network subnet endpoint policy encryption key rotation audit metric alarm dashboard").split()


def sentence(rng: random.Random, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return body[0].upper() + body[1:] + "."


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng, rng.randint(8, 22)) for _ in range(sentences))


def plain_text(rng: random.Random, paragraphs: int) -> str:
    return "\n\n".join(paragraph(rng, rng.randint(3, 7)) for _ in range(paragraphs))


def markdown(rng: random.Random, sections: int) -> str:
    parts = []
    for n in range(sections):
        parts.append(f"## Section {n}: {sentence(rng, 4)[:-1]}")
        parts.append(paragraph(rng, 4).replace(" queue ", " *queue* ", 1).replace(" index ", " [index](https://x/) ", 1))
        parts.append("\n".join(f"- {sentence(rng, 6)}" for _ in range(3)))
        parts.append("```\nsome code block line\n```")
    return "\n\n".join(parts) + "\n"


def html_page(rng: random.Random, paragraphs: int) -> str:
    """An HTML page with the boilerplate real pages carry: head, scripts, styles, a nav bar, a footer."""
    body = "\n".join(f"<p>{paragraph(rng, 4).replace(' model ', ' <b>model</b> ', 1)}</p>" for _ in range(paragraphs))
    nav = "".join(f'<li><a href="/p{i}">Menu item {i}</a></li>' for i in range(12))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Guide</title>"
        "<style>body { color: #333; font-family: sans-serif } .nav li { display: inline }</style>"
        "<script>window.analytics = function () { return 'tracking'; };</script></head><body>"
        f"<nav class='nav'><ul>{nav}</ul></nav><main><h1>{sentence(rng, 5)}</h1>{body}</main>"
        "<script>document.querySelectorAll('a').forEach(a => a.rel = 'noopener');</script>"
        "<footer><p>Copyright notice.</p></footer></body></html>"
    )


def jsonl(rng: random.Random, records: int) -> str:
    return "".join(json.dumps({"id": i, "text": paragraph(rng, rng.randint(2, 6))}) + "\n" for i in range(records))


def _pdf_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def text_pdf(pages: list[str], *, line_chars: int = 95) -> bytes:
    """A valid PDF with one page per string, the text in Helvetica 10 pt, wrapped at ``line_chars``."""
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, text in enumerate(pages):
        lines = [line for block in text.split("\n") for line in (textwrap.wrap(block, line_chars) or [""])]
        shown = " ".join(f"({_pdf_escape(line)}) Tj T*" for line in lines)
        stream = f"BT /F1 10 Tf 12 TL 50 760 Td {shown} ET".encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       f"/Contents {5 + 2 * i} 0 R >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def pdf_document(rng: random.Random, pages: int) -> bytes:
    """A multi-page PDF of about 55 lines (3 KiB of text) per page, a dense text page."""
    return text_pdf([plain_text(rng, 5) for _ in range(pages)])


def corrupt_pdf() -> bytes:
    """A PDF cut off after its header: what a failed upload leaves."""
    return text_pdf(["intact for a moment"])[:40]
