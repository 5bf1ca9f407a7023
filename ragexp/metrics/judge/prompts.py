"""The prompts a judge metric uses: their fingerprint, and their adaptation to another language.

ragas' modern metrics keep their prompts as ``BasePrompt`` attributes (instruction plus few-shot
examples). ``prompt.adapt(language, llm)`` translates the examples with one LLM call; ragexp
saves the result as JSON under ``prompts_path`` and loads it on later runs, so adaptation costs
calls once per judge identity. A prompt that cannot be adapted keeps its English text, and the
run says so once. The English source prompts are dumped once per ragas version too, so a run
whose judge scores all come from the cache never imports ragas.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def prompts_of(metric: Any) -> dict[str, Any]:
    """The metric object's prompt attributes (ragas ``BasePrompt``), by attribute name."""
    from ragas.prompt.metrics.base_prompt import BasePrompt

    return {name: value for name, value in sorted(vars(metric).items()) if isinstance(value, BasePrompt)}


def dump_prompt(prompt: Any) -> dict[str, Any]:
    examples = getattr(prompt, "examples", None)
    return {
        "class": type(prompt).__name__,
        "language": getattr(prompt, "language", "english"),
        "instruction": getattr(prompt, "instruction", ""),
        "examples": None
        if examples is None
        else [
            [example_in.model_dump(mode="json"), example_out.model_dump(mode="json")]
            for example_in, example_out in examples
        ],
    }


def load_prompt(prompt: Any, data: dict[str, Any]) -> None:
    """Apply a saved prompt (instruction, examples, language) to a fresh prompt object."""
    prompt.instruction = data["instruction"]
    prompt.language = data["language"]
    if data.get("examples") is not None:
        prompt.examples = [
            (prompt.input_model.model_validate(example_in), prompt.output_model.model_validate(example_out))
            for example_in, example_out in data["examples"]
        ]


def fingerprint(dumped: dict[str, dict[str, Any]]) -> str:
    """sha256 of prompts as dumped (metric -> attribute -> prompt)."""
    text = json.dumps(dumped, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def saved_path(folder: Path, language: str, model: str, metric: str, source: str) -> Path:
    """One file per metric, judge model, language and version of the English source prompts."""
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model)
    return folder / language / slug / f"{metric}-{source[:12]}.json"


def read_saved(path: Path) -> dict[str, Any] | None:
    """A saved prompts file, or None when it is missing or unreadable (it is then made again).

    The state dir may be shared by every run of a user (any store but SQLite): a file left
    half-written by a process killed before writes were atomic must not stop later runs.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_saved(path: Path, data: dict[str, Any]) -> None:
    """Write a prompts file atomically: a run reading it at the same time sees the old one or
    the new one, never part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(data, ensure_ascii=False, indent=1))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
