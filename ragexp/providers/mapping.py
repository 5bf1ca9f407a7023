"""The mapping layer shared by configured systems (HTTP, Python): request templates in, output
fields out.

A template is any JSON-like structure whose strings may hold ``{question}``, ``{k}``,
``{case_id}`` and the case's metadata fields; a response mapping is one JMESPath expression per
output field, compiled once before the run. Both are pure: no I/O, no provider state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.parser

from ragexp import limits
from ragexp.config.models import ResponseMapping
from ragexp.errors import ConfigError
from ragexp.providers.expressions import Expression, Level, compile_expression, levels_of, to_plain, truthy, value_kind
from ragexp.providers.hops import HopReadError, hop_fields, read_calls, with_merged
from ragexp.records import Case, SystemOutput

BUILTIN_PLACEHOLDERS = ("question", "k", "case_id", "history", "messages", "conversation_id")
"""Placeholders every case fills; any other name is a field of the case's ``metadata``.
``history`` is the earlier turns of a conversation (a JSON list of ``{"role", "content"}``, empty
for a single question or a first turn); ``messages`` is that history followed by the question as
the user's message (an OpenAI chat request's ``messages``); ``conversation_id`` is the id the service gave in the
previous turn's reply (``response.conversation_id``), an empty string before it gave one (a
request key whose value is ``{conversation_id}`` alone is then left out)."""

NEW_CONVERSATION = "{conversation_id}"
"""A request value that is this placeholder alone: its key is sent once the service gave an id."""

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``{name}`` is a placeholder; ``{{`` and ``}}`` are literal braces (as in ``str.format``);
any other brace is text."""

OUTPUT_OF = {
    "answer": "response",
    "ranked_ids": "retrieved_ids",
    "contexts": "retrieved_contexts",
    "citations": "citations",
    "doc_ids": "retrieved_doc_ids",
}
"""Mapping key -> the output field metrics ask for (``ragexp.metrics.registry``' names)."""

MAX_CITATION = 2**31 - 1

CONTRACT = ResponseMapping(
    answer="answer",
    ranked_ids="ranked_ids",
    contexts="contexts",
    citations="citations",
    timings="timings",
    doc_ids="doc_ids",
    stages="stages",
    retrievals="retrievals",
)
"""ragexp's own contract as a mapping: the fields a system returns when no ``response`` is set."""


CONTRACT_KEYS = frozenset({*CONTRACT.model_fields_set, "citation_pattern"})
"""The keys that say where the outputs are: a ``response`` that sets any of them is the whole
mapping; one that sets none (usage, an error envelope, a conversation id) adds to the contract."""


def over_contract(response: ResponseMapping | None) -> ResponseMapping:
    """The mapping a system without a preset's own ``response`` reads replies with: ragexp's
    contract, with what ``response`` adds when it names none of the contract's outputs
    (``provider.system.response.prompt_tokens=usage.prompt_tokens`` alone keeps the contract's
    answer, ranked ids and contexts rather than dropping them)."""
    if response is None:
        return CONTRACT
    if response.model_fields_set & CONTRACT_KEYS:
        return response
    return CONTRACT.model_copy(update={key: getattr(response, key) for key in response.model_fields_set})


class ReplyError(Exception):
    """A system answered, but the reply cannot be scored: an error for that case."""


class SystemReplyError(ReplyError):
    """The reply is the system's own error envelope (the ``error`` expression matched)."""


class MappingError(ReplyError):
    """A mapped value has the wrong type, or an output the run needs was not found; the message
    names the output as the mapping names it, the expression and what the reply held."""


# -- request templates ----------------------------------------------------------------------


def placeholders(template: Any) -> set[str]:
    """Every placeholder name used in the strings of ``template``."""
    found: set[str] = set()
    for text in _strings(template):
        found.update(match.group(1) for match in _PLACEHOLDER.finditer(text) if match.group(1))
    return found


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def check_template(template: Any, where: str, cases: Sequence[Case] = (), source: str = "line") -> None:
    """Refuse, before any run, a placeholder no case can fill: a name that is neither a built-in
    (``question``, ``k``, ``case_id``) nor a ``metadata`` field of every case in ``cases``
    (``source``: the cases' file, named in the message with the case's line)."""
    names = sorted(placeholders(template) - set(BUILTIN_PLACEHOLDERS))
    for name in names:
        for case in cases:
            if name not in case.metadata:
                at = f"line {case.line}" if source == "line" else f"{source}:{case.line}"
                raise ConfigError(
                    f"{where}: unknown placeholder {{{name}}}: not one of {', '.join(BUILTIN_PLACEHOLDERS)} "
                    f"and not a metadata field of case '{case.id}' ({at})"
                )
        if not cases:
            raise ConfigError(
                f"{where}: unknown placeholder {{{name}}}: not one of {', '.join(BUILTIN_PLACEHOLDERS)} "
                "(metadata fields are checked against the dataset)"
            )


def render(template: Any, case: Case, k: int) -> Any:
    """``template`` with every placeholder filled for ``case``. A string that is exactly one
    placeholder takes the value's own type (``"{k}"`` is the number k; a metadata field keeps its
    JSON type); placeholders inside longer text are replaced by the value's text."""
    values: dict[str, Any] = dict(case.metadata)
    values.update(
        question=case.question,
        k=k,
        case_id=case.id,
        history=case.history or [],
        messages=[*(case.history or []), {"role": "user", "content": case.question}],
        conversation_id=case.conversation_ref or "",
    )
    return _fill(template, values)


def _fill(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, str):
        return _fill_text(value, values)
    if isinstance(value, Mapping):
        # Before the service gave a conversation id, a key holding only {conversation_id} is left
        # out: Dify's conversation_id and RAGFlow's session_id start a new conversation when absent.
        return {
            key: _fill(item, values)
            for key, item in value.items()
            if item != NEW_CONVERSATION or values.get("conversation_id")
        }
    if isinstance(value, list | tuple):
        return [_fill(item, values) for item in value]
    return value


def _fill_text(text: str, values: dict[str, Any]) -> Any:
    if "{" not in text and "}" not in text:
        return text
    whole = _PLACEHOLDER.fullmatch(text)
    if whole is not None and whole.group(1):
        return _value(whole.group(1), values)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name:
            return match.group(0)[0]
        value = _value(name, values)
        return value if isinstance(value, str) else _text_of(value)

    return _PLACEHOLDER.sub(replace, text)


def _value(name: str, values: dict[str, Any]) -> Any:
    if name not in values:
        raise ConfigError(f"unknown placeholder {{{name}}}")
    return values[name]


def _text_of(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- response mappings ----------------------------------------------------------------------

_EXPRESSION_KEYS = (
    "error",
    "conversation_id",
    "answer",
    "ranked_ids",
    "contexts",
    "citations",
    "timings",
    "doc_ids",
    "scores",
    "stages",
    "prompt_tokens",
    "completion_tokens",
    "retrievals",
    "tool_calls",
)

TOKEN_KEYS = {"prompt_tokens": "prompt", "completion_tokens": "completion"}
"""Mapping key -> the name of the count in :attr:`SystemOutput.tokens`."""

LIST_KEYS = ("ranked_ids", "contexts", "citations")
"""Outputs whose expression must find a list: one that finds nothing (a missing key, a null, a
projection whose items lack the field) is an error for the case when the run's metrics read it."""

Gaps = tuple[int, int]
"""(items the projection found nothing in, items it read): ``(0, n)`` when nothing is missing."""

STAGE_KEYS = frozenset({"ids", "scores", "ids_in"})
"""What a stage's detail may hold: the ids it produced (best first), their scores, and the ids
it was given (a reranker's order in)."""

RETRIEVE_STAGE = "retrieve"
"""The stage detail that ``response.scores`` fills: the retrieval that produced ``ranked_ids``."""


@dataclass(frozen=True)
class CompiledMapping:
    """A :class:`ResponseMapping` with its expressions parsed, ready to apply to many replies."""

    mapping: ResponseMapping
    expressions: dict[str, Expression]
    """Mapping key -> parsed JMESPath, for the keys that are set."""
    pattern: re.Pattern[str] | None
    levels: dict[str, list[Level]] = dataclasses.field(default_factory=dict)
    """List key -> the projections its expression reads items through (to count items that
    had nothing where the expression looks: JMESPath drops them silently)."""

    def fields(self) -> frozenset[str]:
        """The output fields (metric names: ``response``, ``retrieved_ids``, ...) this mapping
        can supply; latency is measured, so always present."""
        given = {OUTPUT_OF[key] for key in OUTPUT_OF if key in self.expressions}
        if self.pattern is not None:
            given.add("citations")
        given |= hop_fields(self.expressions)
        return frozenset({*given, "latency_seconds"})

    def search(self, key: str, data: Any) -> Any:
        """What the expression of ``key`` finds in ``data`` (None when it is unset)."""
        expression = self.expressions.get(key)
        if expression is None:
            return None
        try:
            return expression.search(data)
        except jmespath.exceptions.JMESPathError as exc:  # e.g. sort_by over values of mixed types
            raise MappingError(f"{key}: {self._expr(key)} failed on the reply: {' '.join(str(exc).split())}") from None

    def gaps(self, key: str, data: Any, value: Any) -> Gaps | None:
        """For a list ``value`` that ``key``'s expression found in ``data`` through projections:
        how many of the items read had nothing where the expression looks, and how many items
        were read. None when the expression reads no projection."""
        levels = self.levels.get(key)
        if not levels or type(value) is not list:
            return None
        missing, items = 0, 0
        try:
            for depth, level in enumerate(levels):
                base = level.base.search(data)
                result = value if level.result is None else level.result.search(data)
                count = len(base) if type(base) in (list, dict) else None
                if count is None or type(result) is not list:
                    continue
                missing += max(0, count - len(result))
                # Items an inner projection dropped never reach the outer one: count them in.
                items += count if depth == 0 else max(0, count - len(result))
        except jmespath.exceptions.JMESPathError:
            return None  # the expression itself ran: what it found stands
        return missing, items

    def reply_error(self, data: Any) -> str | None:
        """The error message when ``data`` is an error envelope, else None."""
        found = self.search("error", data)
        if not truthy(found):
            return None
        return found if isinstance(found, str) else _text_of(to_plain(found))

    def extract(self, data: Any, latency: float | None, needed: frozenset[str] | None = None) -> SystemOutput:
        """The output fields of one decoded reply. Raises :class:`SystemReplyError` on an error
        envelope and :class:`MappingError` when a field has the wrong type, or when an output
        in ``needed`` (output field names, as metrics name them; None: every output) was not
        found."""
        message = self.reply_error(data)
        if message is not None:
            raise SystemReplyError(message)
        found = {key: self.search(key, data) for key in self.expressions if key != "error"}
        gaps = {key: self.gaps(key, data, found[key]) for key in self.levels if key in found}
        return self.build(found, latency, needed=needed, gaps=gaps, where=Where.reply(data))

    def build(
        self,
        found: Mapping[str, Any],
        latency: float | None,
        *,
        needed: frozenset[str] | None = None,
        gaps: Mapping[str, Gaps | None] | None = None,
        where: Where | None = None,
    ) -> SystemOutput:
        """A :class:`SystemOutput` from the raw values the expressions found (a streamed reply
        gathers them over its events), checked and converted. ``gaps``: what :meth:`gaps` said
        of each list; ``where``: what the values were read from, for the messages."""
        where = where or Where(lambda: "the reply")
        try:
            calls, retrievals = read_calls(found, self.mapping, where.text)
        except HopReadError as exc:
            raise MappingError(str(exc)) from None
        found = with_merged(found, retrievals)
        self._check_found(found, gaps or {}, needed, where)
        answer = self._answer(found, where)
        ranked = self._strings("ranked_ids", found.get("ranked_ids"))
        contexts = self._strings("contexts", found.get("contexts"))
        if ranked and contexts and len(ranked) != len(contexts):
            raise MappingError(
                f"contexts ({self._expr('contexts')}) has {len(contexts)} items but ranked_ids "
                f"({self._expr('ranked_ids')}) has {len(ranked)}"
            )
        citations = self._citations(found.get("citations"), answer, ranked)
        timings = self._timings(found.get("timings"))
        output = SystemOutput(ranked, contexts, answer, citations, latency, timings)
        doc_ids = self._strings("doc_ids", found.get("doc_ids"))
        if any(doc_ids):  # all empty: the system named no chunk's document
            chunks = len(ranked or contexts)
            if len(doc_ids) != chunks:
                raise MappingError(
                    f"doc_ids ({self._expr('doc_ids')}) has {len(doc_ids)} items "
                    f"but the reply retrieved {chunks} chunks"
                )
            output.doc_ids = doc_ids
        output.stages = self._stages(found.get("stages"), found.get("scores"), ranked)
        conversation = found.get("conversation_id")
        if conversation is not None and conversation != "":
            if type(conversation) not in (str, int) or isinstance(conversation, bool):
                raise MappingError(
                    f"conversation_id ({self._expr('conversation_id')}) is {type(conversation).__name__}, "
                    "expected a string"
                )
            output.conversation_id = str(conversation)
        output.tokens = self._tokens(found)
        output.tool_calls, output.retrievals = calls, retrievals
        return output

    def check_turn(self, output: SystemOutput, case: Case) -> None:
        """A turn of a conversation whose reply gave no conversation id, though
        ``response.conversation_id`` is mapped: an error for that turn (else each of its later
        turns would silently start a conversation of its own on the service)."""
        if case.conversation is not None and "conversation_id" in self.expressions and not output.conversation_id:
            raise MappingError(
                f"conversation_id ({self._expr('conversation_id')}) found nothing in the reply: the next turns of "
                f"conversation {case.conversation} would each start a new conversation (map the id the service "
                "issues, or set response.conversation_id=null for a service that keeps none)"
            )

    def reports_usage(self) -> bool:
        """Whether replies are read for the tokens the system used."""
        return any(key in self.expressions for key in TOKEN_KEYS)

    def _tokens(self, found: Mapping[str, Any]) -> dict[str, int] | None:
        """The usage a reply reported; a count that is there but no non-negative integer is an
        error for the case (a number that cannot be read is not zero)."""
        tokens: dict[str, int] = {}
        for key, name in TOKEN_KEYS.items():
            value = found.get(key)
            if value is None:
                continue
            reason = limits.count_problem(value)
            if reason is not None:
                raise MappingError(f"{key}: what {self._expr(key)} found {reason}")
            tokens[name] = int(value)
        return tokens or None

    def _check_found(
        self, found: Mapping[str, Any], gaps: Mapping[str, Gaps | None], needed: frozenset[str] | None, where: Where
    ) -> None:
        """An output the run reads that the expression did not find is an error, never an empty
        list scored as if the system had retrieved nothing. A present empty list is an empty
        ranking."""
        for key in LIST_KEYS:
            if key not in self.expressions or (needed is not None and OUTPUT_OF[key] not in needed):
                continue
            if found.get(key) is None:
                raise MappingError(f"{key}: {self._expr(key)} found nothing in {where.text}{where.preview}")
            gap = gaps.get(key)
            if gap is not None and gap[0]:
                raise MappingError(
                    f"{key}: {self._expr(key)} found nothing in {gap[0]} of the {gap[1]} items it read "
                    f"in {where.text}{where.preview}"
                )

    def _expr(self, key: str) -> str:
        return repr(getattr(self.mapping, key))

    def _answer(self, found: Mapping[str, Any], where: Where) -> str:
        if "answer" not in found:
            return ""
        value = found.get("answer")
        if value is None:
            raise MappingError(f"answer: {self._expr('answer')} found nothing in {where.text}{where.preview}")
        if not isinstance(value, str):
            raise MappingError(f"answer: {self._expr('answer')} gave {value_kind(value)}, not a string")
        return value

    def _strings(self, key: str, value: Any) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise MappingError(f"{key}: {self._expr(key)} gave {value_kind(value)}, not a list of strings")
        out: list[str] = []
        for item in value:
            if isinstance(item, str):
                out.append(item)
            elif key in ("ranked_ids", "doc_ids") and isinstance(item, int) and not isinstance(item, bool):
                out.append(str(item))
            else:
                raise MappingError(f"{key}: {self._expr(key)} gave a list holding {value_kind(item)}, not strings")
        return out

    def _citations(self, value: Any, answer: str, ranked: list[str]) -> list[int]:
        raw: list[Any] = []
        if value is not None:
            if not isinstance(value, list):
                raise MappingError(f"citations: {self._expr('citations')} gave {value_kind(value)}, not a list")
            raw.extend(value)
        if self.pattern is not None:
            raw.extend(match.group(1) for match in self.pattern.finditer(answer))
        out: list[int] = []
        for item in raw:
            number = self._citation(item, ranked)
            if number not in out:
                out.append(number)
        return out

    def _citation(self, item: Any, ranked: list[str]) -> int:
        mapping = self.mapping
        if mapping.citations_as == "id":
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise MappingError(f"citations: {value_kind(item)} is not a chunk id")
            text = str(item)
            # An id that was not retrieved cites nothing the reader saw: past the end, where the
            # citation metrics count it as unsupported.
            return ranked.index(text) + 1 if text in ranked else len(ranked) + 1
        number: int | None = None
        if isinstance(item, int) and not isinstance(item, bool):
            number = item
        elif isinstance(item, str) and item.strip().isdigit():
            number = int(item)
        if number is None:
            raise MappingError(f"citations: {value_kind(item)} is not a position in ranked_ids")
        position = number - mapping.citation_base + 1
        if not 1 <= position <= MAX_CITATION:
            raise MappingError(f"citations: {number} is not a {mapping.citation_base}-based position")
        return position

    def _timings(self, value: Any) -> dict[str, float] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise MappingError(
                f"timings: {self._expr('timings')} must give an object of seconds, not {value_kind(value)}"
            )
        if len(value) > limits.MAX_STAGES:
            raise MappingError(
                f"timings: {self._expr('timings')} names {len(value)} stages, more than {limits.MAX_STAGES}"
            )
        for name, seconds in value.items():
            reason = limits.seconds_problem(seconds)
            if reason is not None:
                raise MappingError(
                    f"timings: {self._expr('timings')} must give an object of seconds; {str(name)!r} {reason}"
                )
        return {str(name): float(seconds) for name, seconds in value.items()}

    def _stages(self, value: Any, scores: Any, ranked: list[str]) -> dict[str, dict[str, list[Any]]] | None:
        stages: dict[str, dict[str, list[Any]]] = {}
        if value is not None:
            try:
                stages = check_stages(value)
            except ValueError as exc:
                raise MappingError(f"stages: {self._expr('stages')} {exc}") from None
        if scores is not None:
            if not isinstance(scores, list) or not all(item is None or _score(item) for item in scores):
                raise MappingError(f"scores: {self._expr('scores')} must give a list of finite numbers (or nulls)")
            if len(scores) != len(ranked):
                raise MappingError(
                    f"scores ({self._expr('scores')}) has {len(scores)} items but ranked_ids "
                    f"({self._expr('ranked_ids')}) has {len(ranked)} (map(&score, items) keeps an item's null score)"
                )
            stages[RETRIEVE_STAGE] = {"ids": list(ranked), "scores": _floats(scores)}
        return stages or None


NEEDED = "needed by the chosen metrics"
UNUSED = "no chosen metric reads it"


def mark_missing(
    missing: dict[str, str], label: str, key: str, value: Any, gaps: Gaps | None, needed: frozenset[str] | None
) -> None:
    """Note under ``label`` (``validate --probe``'s) an output whose expression found nothing,
    or nothing in some of the items it read, and whether the chosen metrics read it."""
    if key != "answer" and key not in LIST_KEYS:
        return
    reads = key == "answer" or needed is None or OUTPUT_OF[key] in needed
    what = NEEDED if reads else UNUSED
    if value is None:
        missing[label] = what
    elif gaps is not None and gaps[0]:
        missing[label] = f"nothing in {gaps[0]} of {gaps[1]} items; {what}"


class Where:
    """What mapped values were read from, as a message says it: "the reply" with a preview of
    it, or "5 events (message 4, message_end 1)". Worked out only when a message needs it (most
    replies need none)."""

    def __init__(self, describe: Callable[[], str], show: Callable[[], str] = lambda: "") -> None:
        self._describe = describe
        self._show = show

    @property
    def text(self) -> str:
        return self._describe()

    @property
    def preview(self) -> str:
        return self._show()

    @classmethod
    def reply(cls, data: Any) -> Where:
        return cls(lambda: "the reply", lambda: f" ({preview(data)})")


PREVIEW_CHARS = 120
"""Characters of a reply shown beside an output that was not found in it."""


def preview(data: Any) -> str:
    """A short, one-line preview of a decoded reply (JSON text), its invisible characters shown
    as escapes."""
    from ragexp.escape import terminal

    try:
        text = json.dumps(data, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # pragma: no cover - plain data dumps
        text = str(data)
    text = " ".join(text[: PREVIEW_CHARS * 2].split())
    return terminal(text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS else ""))


def _floats(values: list[Any]) -> list[Any]:
    return [None if item is None else float(item) for item in values]


def _score(value: Any) -> bool:
    # numbers.Real takes numpy's scalars too (np.float32 is not a float).
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_stages(value: Any) -> dict[str, dict[str, list[Any]]]:
    """Stage detail as a system reports it, checked: ``{stage: {"ids": [...], "scores": [...],
    "ids_in": [...]}}`` (each key optional; ``scores`` aligned with ``ids``). Raises ValueError
    saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"must give an object of stages, not {value_kind(value)}")
    out: dict[str, dict[str, list[Any]]] = {}
    for stage, detail in value.items():
        if not isinstance(detail, dict) or not set(detail) <= STAGE_KEYS:
            raise ValueError(f"stage {str(stage)!r} must be an object with {', '.join(sorted(STAGE_KEYS))}")
        checked: dict[str, list[Any]] = {}
        for key in ("ids", "ids_in"):
            items = detail.get(key)
            if items is None:
                continue
            if not isinstance(items, list) or not all(
                isinstance(item, str | int) and not isinstance(item, bool) for item in items
            ):
                raise ValueError(f"stage {str(stage)!r}: {key} must be a list of ids")
            checked[key] = [str(item) for item in items]
        scores = detail.get("scores")
        if scores is not None:
            if not isinstance(scores, list) or not all(item is None or _score(item) for item in scores):
                raise ValueError(f"stage {str(stage)!r}: scores must be a list of finite numbers (or nulls)")
            if len(scores) != len(checked.get("ids", [])):
                raise ValueError(f"stage {str(stage)!r}: scores must be as many as ids")
            checked["scores"] = _floats(scores)
        out[str(stage)] = checked
    return out


def compile_mapping(mapping: ResponseMapping, where: str) -> CompiledMapping:
    """Parse every expression of ``mapping`` (and its citation pattern) up front; ``where`` is
    the config path of the mapping (``provider.system.response``)."""
    expressions: dict[str, Expression] = {}
    levels: dict[str, list[Level]] = {}
    for key in _EXPRESSION_KEYS:
        text = getattr(mapping, key)
        if text is not None:
            expressions[key] = compile_expression(text, f"{where}.{key}")
            found = levels_of(jmespath.compile(text).parsed) if key in LIST_KEYS else []
            if found:
                levels[key] = found
    pattern = None
    if mapping.citation_pattern is not None:
        try:
            pattern = re.compile(mapping.citation_pattern)
        except re.error as exc:
            raise ConfigError(f"{where}.citation_pattern: not a regular expression: {exc}") from None
        if pattern.groups != 1:
            raise ConfigError(
                f"{where}.citation_pattern: needs exactly one group (the cited number or id), has {pattern.groups}"
            )
    return CompiledMapping(mapping, expressions, pattern, levels)


# -- plain data -----------------------------------------------------------------------------
