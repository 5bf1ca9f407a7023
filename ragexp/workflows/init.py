"""``ragexp init [DIR]``: a starter config folder in the user's own repository.

The files name only what is the user's own (their cases, their service, their gate); everything
else comes from the packaged defaults, which ragexp composes under ``conf/``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ragexp.errors import ConfigError
from ragexp.paths import package_conf, packaged_owner

STARTER_CASES = [
    {
        "id": "refund-deadline",
        "question": "买了东西多久内可以申请无理由退货？",
        "relevant_ids": ["refund-policy"],
        "expected_facts": ["七天"],
        "reference": "自签收之日起七天内，商品未使用且不影响二次销售的，可申请七天无理由退货退款。",
    },
    {
        "id": "refund-arrival-time",
        "question": "退款多久到账？",
        "relevant_ids": ["refund-arrival"],
        "expected_facts": ["1-3 个工作日"],
        "reference": "退款审核通过后原路退回：微信和支付宝 1-3 个工作日到账，银行卡 3-7 个工作日到账。",
    },
]

DATASET = """\
# Your evaluation set: `ragexp run dataset=my_set`. Replace data/my_set.jsonl with your cases,
# one JSON object a line:
#   id            unique case id
#   question      what is sent to your service
#   relevant_ids  ids of the chunks/documents a correct retrieval returns (recall, MRR, nDCG, citations)
#   expected_facts  short strings a correct answer contains (answer_accuracy)
#   reference     a reference answer (judge metrics such as context_recall)
#   unanswerable  true for a question your knowledge base cannot answer (a refusal is then correct)
# The two starter cases ask the bundled sample knowledge base (experiments/kb_zh in ragexp's
# repository); check your cases with `ragexp validate dataset=my_set`.
# Relative paths are read from the working directory, then from the folder holding conf/.
name: my_set
path: data/my_set.jsonl
author: CHANGE ME (who wrote the cases)
description: CHANGE ME (one sentence on what the cases cover)
# What your service says when it refuses to answer (an unanswerable case is correct when it does):
refusal_phrases: [没有足够证据, 无法回答, 证据不足, cannot answer, not enough evidence]
"""

SYSTEM = """\
# @package provider.system
# Your RAG service: `ragexp run system=my_service`. ragexp POSTs {"question", "k", "case_id"} as
# JSON to `url` and expects {"ranked_ids", "contexts", "answer", "citations"} back
# (+ optional "timings"). A service with its own API: set `request`, `response` and `stream`
# (docs/systems.md), or start from a preset: ragexp init --system dify|ragflow|openai_chat.
kind: http
url: http://127.0.0.1:8000/query   # CHANGE ME: your service's query endpoint
# timeout_s: 30                    # deadline of one attempt, in seconds
# headers_env: {Authorization: MY_SERVICE_AUTH}   # header -> environment variable holding its value
# ca_file: /path/to/private-ca.pem
"""

PYTHON_SYSTEM = """\
# @package provider.system
# Your Python pipeline, called in-process: `ragexp run system=my_service` (docs/systems.md).
kind: python
target: my_package.rag:answer   # CHANGE ME: package.module:attr; attr may be dotted (app:chain.invoke)
# path: src                     # a folder put on the import path before the target is imported
# input: {input: "{question}"}  # one positional argument, filled like an HTTP request template;
#                               # default: keyword arguments among question, k, case_id, metadata
# response:                     # JMESPath of each output in the return value (default: ragexp's names)
#   answer: answer
#   ranked_ids: "context[].id"
#   contexts: "context[].page_content"
# timeout_s: 30                 # deadline of one call, in seconds
"""


METRICS_HEADER = """\
# Your metric set: `ragexp run metrics=my_metrics`. `names` are built-in metrics (docs/metrics.md,
# copied from the packaged `offline` set); `custom` adds your team's own rules, scored beside them
# (docs/metrics.md#your-own-metrics). Uncomment an example to use it.
"""

CUSTOM_EXAMPLES = """\
custom: []
# custom:
#   # A rule as code: hotline_in_refusal in my_rules.py (beside conf/), called once per case as
#   # (case, output) -> a number, a bool or {"score": ..., "rationale": "..."}.
#   - name: hotline_in_refusal
#     kind: python
#     target: my_rules:hotline_in_refusal
#     needs: [answer]            # what it reads: refused before the run if the system lacks it
#     # direction: higher        # range: [0, 1]    over: all (or answerable)    timeout_s: 30
#   # A rubric the configured judge scores (a provider with a judge: provider=replay_judge, npu...).
#   - name: polite_tone
#     kind: judge
#     rubric: 回答语气礼貌、没有责备用户时记 1 分，否则记 0 分。
#     scale: pass_fail           # or [1, 5], mapped onto range
#     needs: [question, answer]  # what the judge is shown
"""

RULES = '''\
"""Your team's own metrics, named in conf/metrics/my_metrics.yaml (metrics.custom).

Each is called once per case as f(case, output): `case` has id, question, relevant_ids,
expected_facts, reference, unanswerable and metadata; `output` is what your system returned:
answer, ranked_ids, contexts, citations, latency_seconds, timings. Return a number or a bool in
the metric's range, or {"score": ..., "rationale": "why"}; raising, None or NaN is an error for
that case, never a zero. What a function prints goes to stderr.
"""

HOTLINE = "400-820-8820"  # CHANGE ME: the number a refusal must give


def hotline_in_refusal(case, output):
    """A refusal must give the hotline number; an answered case passes."""
    if not case.unanswerable:
        return True
    found = HOTLINE in output.answer
    return {"score": found, "rationale": "gives the hotline" if found else f"no {HOTLINE} in the refusal"}
'''
"""``my_rules.py``: the function the example Python metric names."""


def _metrics_template() -> str:
    """The packaged ``offline`` metric set as the user's own, with one custom metric of each kind."""
    text = (package_conf() / "metrics" / "offline.yaml").read_text(encoding="utf-8")
    body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    lines = [line.replace("set: offline", "set: my_metrics", 1) for line in body]
    return METRICS_HEADER + "\n".join(lines) + "\n" + CUSTOM_EXAMPLES


def _preset_template(name: str) -> str:
    """A packaged HTTP preset as the user's own file: every key kept, the URL to fill in."""
    text = (package_conf() / "system" / f"{name}.yaml").read_text(encoding="utf-8")
    lines = []
    for line in text.splitlines():
        if line.startswith("url:"):
            line += "   # CHANGE ME: your endpoint"
        lines.append(line)
    header = f"# Your {name} service: `ragexp run system=my_service` (written from the packaged `{name}` preset).\n"
    return lines[0] + "\n" + header + "\n".join(lines[1:]) + "\n"


def _python_preset_template(name: str, example: str) -> str:
    """A packaged Python preset (LangChain, LlamaIndex) as the user's own file: every key kept,
    the target to fill in."""
    text = (package_conf() / "system" / f"{name}.yaml").read_text(encoding="utf-8")
    lines = []
    for line in text.splitlines():
        if line.startswith("target:"):
            line = f"target: {example}   # CHANGE ME: package.module:attr of yours (docs/systems.md)"
        lines.append(line)
    header = f"# Your {name} pipeline: `ragexp run system=my_service` (written from the packaged `{name}` preset).\n"
    return lines[0] + "\n" + header + "\n".join(lines[1:]) + "\n"


SYSTEM_TEMPLATES: dict[str, Callable[[], str]] = {
    "http": lambda: SYSTEM,
    "dify": lambda: _preset_template("dify"),
    "ragflow": lambda: _preset_template("ragflow"),
    "openai_chat": lambda: _preset_template("openai_chat"),
    "python": lambda: PYTHON_SYSTEM,
    "langchain": lambda: _python_preset_template("langchain", "my_package.rag:chain"),
    "llamaindex": lambda: _python_preset_template("llamaindex", "my_package.rag:query_engine.query"),
}
"""``ragexp init --system NAME`` -> the content of ``conf/system/my_service.yaml``."""

GITIGNORE = ".gitignore"
GITIGNORE_LINES = ["mlruns/"]


def starter_files(system: str = "http") -> dict[str, str]:
    """Relative path -> content of every file ``ragexp init`` writes (``.gitignore`` apart)."""
    template = SYSTEM_TEMPLATES.get(system)
    if template is None:
        raise ConfigError(f"--system: unknown system '{system}' (known: {', '.join(SYSTEM_TEMPLATES)})")
    release = (package_conf() / "gates" / "release.yaml").read_text(encoding="utf-8")
    body = "\n".join(line for line in release.splitlines() if not line.startswith("#"))
    gates = (
        "# Your release gate: `ragexp gate --baseline RUN_ID gates=my_release`. Copied from the packaged\n"
        "# `release` preset; tighten or loosen each rule for your service (docs/config.md lists the rule keys:\n"
        "# max_drop, max_increase_ratio, min, max, statistical). Metrics not named here never fail the gate.\n"
        + body.replace("name: release", "name: my_release", 1).strip()
        + "\n"
    )
    cases = "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in STARTER_CASES)
    return {
        "conf/dataset/my_set.yaml": DATASET,
        "conf/system/my_service.yaml": template(),
        "conf/gates/my_release.yaml": gates,
        "conf/metrics/my_metrics.yaml": _metrics_template(),
        "data/my_set.jsonl": cases,
        "my_rules.py": RULES,
    }


@dataclass(frozen=True)
class Planned:
    """One file ``ragexp init`` writes: its path under the target folder and its content
    (``append``: added at the end of the file if it exists, as the ``.gitignore`` lines are)."""

    path: str
    content: str
    append: bool = False


def plan_init(directory: Path, force: bool = False, system: str = "http") -> list[Planned]:
    """Every file ``ragexp init`` would write under ``directory``, after every check: nothing is
    written before all of them pass, so a refusal leaves the folder as it was.

    Refused in one line: an unknown ``system``; a target that cannot take the files (a file, a
    path through a file, a folder without write permission, a starter path that is a folder);
    ragexp's own folders (a checkout of ragexp, whose ``conf/`` is the packaged tree, a packaged
    config tree, the installed package); starter files that exist, unless ``force``."""
    files = starter_files(system)
    check_not_packaged(directory)
    check_target(directory)
    planned = [Planned(name, content) for name, content in files.items()]
    for item in planned:
        path = directory / item.path
        if path.is_dir():
            raise ConfigError(f"ragexp init {directory}: cannot write {path} (a folder is there)")
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise ConfigError(f"ragexp init {directory}: cannot write {path} ({blocking} is a file)")
    existing = [directory / item.path for item in planned if (directory / item.path).exists()]
    if existing and not force:
        raise ConfigError(f"{existing[0]}: already exists (ragexp init --force overwrites the starter files)")
    ignore = _gitignore_lines(directory)
    return [*planned, ignore] if ignore is not None else planned


def _gitignore_lines(directory: Path) -> Planned | None:
    """The lines of :data:`GITIGNORE_LINES` the folder's ``.gitignore`` lacks (None: none)."""
    ignore = directory / GITIGNORE
    if ignore.is_dir():
        raise ConfigError(f"ragexp init {directory}: cannot write {ignore} (a folder is there)")
    try:
        text = ignore.read_text(encoding="utf-8") if ignore.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigError(f"ragexp init {directory}: cannot read {ignore} ({reason})") from None
    lines = text.splitlines()
    missing = [line for line in GITIGNORE_LINES if line not in lines and line.rstrip("/") not in lines]
    if not missing:
        return None
    prefix = "\n" if text and not text.endswith("\n") else ""
    comment = "# MLflow store of `ragexp run` (SQLite and artifacts)\n"
    return Planned(GITIGNORE, prefix + comment + "\n".join(missing) + "\n", append=True)


def write_plan(directory: Path, planned: list[Planned]) -> list[Path]:
    """Write what :func:`plan_init` planned; returns the paths written."""
    written = []
    try:
        for item in planned:
            path = directory / item.path
            path.parent.mkdir(parents=True, exist_ok=True)
            if item.append:
                with path.open("a", encoding="utf-8") as handle:
                    handle.write(item.content)
            else:
                path.write_text(item.content, encoding="utf-8")
            written.append(path)
    except OSError as exc:  # every path was checked: a disk that filled up meanwhile
        where = exc.filename or directory
        raise ConfigError(f"ragexp init {directory}: cannot write {where} ({exc.strerror or exc})") from None
    return written


def init_project(directory: Path, force: bool = False, system: str = "http") -> list[Path]:
    """Write the starter files under ``directory`` (``conf/system/my_service.yaml`` from the
    ``system`` template): :func:`plan_init`, then :func:`write_plan`."""
    return write_plan(directory, plan_init(directory, force=force, system=system))


def check_target(directory: Path) -> None:
    """One line for a target ``ragexp init`` cannot write into, before anything is written."""
    import os
    import tempfile

    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"ragexp init {directory}: is a file, not a folder")
    blocking = next((p for p in directory.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"ragexp init {directory}: {blocking} is a file, not a folder")
    existing = next((p for p in [directory, *directory.parents] if p.exists()), Path.cwd())
    try:  # a probe, not os.access: root may write anywhere except on a read-only file system
        fd, probe = tempfile.mkstemp(prefix=".ragexp-init-", dir=existing)
    except OSError as exc:
        raise ConfigError(f"ragexp init {directory}: cannot write into {existing} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def check_not_packaged(directory: Path) -> None:
    """Refuse ragexp's own folders (:func:`ragexp.paths.packaged_owner`): a user's files never go there."""
    owner = packaged_owner(directory)
    if owner is not None:
        raise ConfigError(f"ragexp init {directory}: {owner}; name a folder of your own project (ragexp init PATH)")


def next_commands(directory: Path) -> list[str]:
    """The three commands a user types next."""
    cd = [] if directory.resolve() == Path.cwd().resolve() else [f"cd {shlex.quote(str(directory))}"]
    first = "ragexp run dataset=my_set system=my_service"
    return [
        *cd,
        f"{first}            # baseline (edit conf/system/my_service.yaml first)",
        f"{first}            # candidate, after changing your service",
        "ragexp gate --baseline BASELINE_RUN_ID dataset=my_set gates=my_release   # exit 0 pass, 2 fail",
    ]
