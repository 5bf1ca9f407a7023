"""What served a judge's calls, as the server says it: the identity a grade is kept under.

The config's judge identity (the ``ragexp.judge`` tag) names what was asked for: a model name, an
alias. What answered can change behind it (a floating alias moved on, a redeployed MindIE model,
a provider's silent update), so every reply is read for what the server says it is: an
OpenAI-compatible reply's ``model`` and ``system_fingerprint``, the embeddings reply's ``model``,
and where the API gives them, a MindIE server's version (``GET /v2``) and a TEI server's model id
and revision (``GET /info``). A grade's served identity is the set of those its calls saw, plus
the digest of the prompts in use.

Which grade a call belongs to is followed through a context variable: each grade's worker sets a
fresh set, and the HTTP layer adds to it; the tasks and threads ragas starts for one grade copy
the context, so they add to the same set.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

SEPARATOR = "; "
"""Between the served identities of a run in its ``ragexp.judge.served`` tag."""

_CURRENT: ContextVar[set[str] | None] = ContextVar("ragexp_judge_served", default=None)


def begin_grade() -> set[str]:
    """A fresh record for the grade about to be computed in this context; returned to be read."""
    seen: set[str] = set()
    _CURRENT.set(seen)
    return seen


def note(part: str) -> None:
    """Record one part of what served the current grade (nothing outside a grade)."""
    seen = _CURRENT.get()
    if seen is not None and part:
        seen.add(part)


def of_reply(channel: str, data: Any) -> str:
    """What an OpenAI-compatible reply says served it (empty: it says nothing)."""
    if not isinstance(data, dict):
        return ""
    model = data.get("model")
    fingerprint = data.get("system_fingerprint")
    if not isinstance(model, str) or not model:
        return ""
    found = f"{channel}={model}"
    if isinstance(fingerprint, str) and fingerprint:
        found += f"@{fingerprint}"
    return found


def of_mindie(data: Any) -> str:
    """MindIE's service metadata (``GET /v2``: ``name``, ``version``)."""
    if isinstance(data, dict) and isinstance(data.get("version"), str) and data["version"]:
        return f"mindie={data['version']}"
    return ""


def of_tei(data: Any) -> str:
    """TEI's ``GET /info`` (``model_id``, ``model_sha``, ``version``)."""
    if not isinstance(data, dict) or not isinstance(data.get("model_id"), str):
        return ""
    revision = data.get("model_sha") or data.get("version")
    return f"tei={data['model_id']}" + (f"@{revision}" if isinstance(revision, str) and revision else "")


def grade_identity(parts: Iterable[str], prompts: str) -> str:
    """One grade's served identity: what answered its calls (sorted), and the prompt digest; empty
    when no call said anything (a server that names nothing, or no call made)."""
    found = sorted({part for part in parts if part})
    return "|".join([*found, f"prompts={prompts}"]) if found else ""


def channels(served: str) -> dict[str, str]:
    """A served identity's parts by channel (``chat``, ``embeddings``, ``mindie``, ``tei``,
    ``prompts``) -> what it said."""
    found: dict[str, str] = {}
    for part in served.split("|") if served else []:
        channel, _, value = part.partition("=")
        found[channel] = value
    return found


def seen(identities: Iterable[str]) -> dict[str, set[str]]:
    """Channel -> every value the served identities of a run named on it."""
    found: dict[str, set[str]] = {}
    for served in identities:
        for channel, value in channels(served).items():
            found.setdefault(channel, set()).add(value)
    return found


def joined(identities: Iterable[str]) -> str:
    """The ``ragexp.judge.served`` tag value: the distinct served identities, sorted."""
    return SEPARATOR.join(sorted({identity for identity in identities if identity}))


def split(tag: str) -> list[str]:
    return [part for part in tag.split(SEPARATOR) if part]


def served_difference(baseline: str, candidate: str) -> str | None:
    """Why two runs' grades are not comparable by who served them (None: they are, or either run
    recorded nothing). Worded for the user, naming both sides."""
    if not baseline or not candidate or set(split(baseline)) == set(split(candidate)):
        return None
    return f"judge served identity differs ({baseline} vs {candidate})"
