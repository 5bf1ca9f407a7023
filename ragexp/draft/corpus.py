"""The documents a set is drafted from: a ``{"id", "text"}`` JSONL chunk file (the one the label
audit reads), or a folder of ``.md`` / ``.txt`` files chunked here.

Folder rule: files are read in sorted order of their path relative to the folder; a file is
split into paragraphs at blank lines, and consecutive paragraphs are joined until a chunk would
pass :data:`MAX_CHARS` characters (a longer paragraph is cut at sentence ends, and a sentence
longer still at :data:`MAX_CHARS`). A chunk's id is ``<relative path>#<n>``, ``n`` counting
the file's chunks from 1: it stays the same as long as the text before it in its file does. A
chunk's document is its file (its relative path); in a JSONL file, its ``doc`` field, else the
chunk itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ragexp.datasets.audit import load_chunks
from ragexp.errors import DatasetError, DatasetErrors

MAX_CHARS = 800
"""Longest chunk cut from a folder's files, in characters."""
SUFFIXES = (".md", ".txt")
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"[^。！？!?\n]*(?:[。！？!?]+|\.(?=\s)|\n|$)")


@dataclass(frozen=True, slots=True)
class Chunk:
    id: str
    text: str
    doc: str = ""
    """The document the chunk is part of: what a drafted case's evidence is anchored to."""

    @property
    def document(self) -> str:
        return self.doc or self.id


def read_corpus(path: Path) -> list[Chunk]:
    """The chunks of a JSONL file or a folder, in corpus order; bad input is a DatasetErrors."""
    if path.is_dir():
        return _folder(path)
    if not path.exists():
        raise DatasetErrors([DatasetError(str(path), None, None, "no such file or folder")])
    corpus = load_chunks(path)
    chunks = [Chunk(chunk_id, text, corpus.doc_of(chunk_id)) for chunk_id, text in corpus.texts.items()]
    for number, chunk in enumerate(chunks, start=1):
        if not chunk.text.strip():
            line = _line_of(path, chunk.id) or number
            raise DatasetErrors([DatasetError(str(path), line, "text", "empty: nothing to draft from")])
    return chunks


def _line_of(path: Path, chunk_id: str) -> int | None:
    needle = f'"{chunk_id}"'
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").split("\n"), start=1):
        if needle in line:
            return number
    return None


def _folder(folder: Path) -> list[Chunk]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    chunks: list[Chunk] = []
    for file in files:
        relative = file.relative_to(folder).as_posix()
        try:
            text = file.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            line = file.read_bytes()[: exc.start].count(b"\n") + 1
            raise DatasetErrors([DatasetError(str(file), line, None, "not valid UTF-8")]) from None
        except OSError as exc:
            raise DatasetErrors([DatasetError(str(file), None, None, f"cannot read: {exc.strerror}")]) from None
        chunks.extend(Chunk(f"{relative}#{n}", body, relative) for n, body in enumerate(chunk_text(text), start=1))
    if not chunks:
        raise DatasetErrors(
            [DatasetError(str(folder), None, None, "empty corpus: no .md or .txt file with text in this folder")]
        )
    return chunks


def chunk_text(text: str, limit: int = MAX_CHARS) -> list[str]:
    """The folder rule on one file's text (see the module docstring)."""
    pieces: list[str] = []
    for paragraph in _PARAGRAPH.split(text.replace("\r\n", "\n")):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if len(paragraph) <= limit:
            pieces.append(paragraph)
            continue
        for sentence in _SENTENCE.findall(paragraph):
            sentence = sentence.strip()
            pieces.extend(sentence[i : i + limit] for i in range(0, len(sentence), limit) if sentence)
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        joined = f"{current}\n\n{piece}" if current else piece
        if current and len(joined) > limit:
            chunks.append(current)
            current = piece
        else:
            current = joined
    if current:
        chunks.append(current)
    return chunks
