"""A conversation's next turn is asked as soon as its previous turn is answered: it never waits
for the turns of other conversations (no rounds of turns with a wait between them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_jsonl

TARGET = """
import asyncio, time
from pathlib import Path

LOG = Path(__file__).with_name("calls.log")
SLOW = 1.5

def _log(what, case_id):
    with LOG.open("a", encoding="utf-8") as out:
        out.write(f"{what} {case_id}\\n")

def _reply(question):
    return {"answer": question, "ranked_ids": ["d0"], "contexts": ["c"], "citations": [1]}

def chat(question, case_id, history):
    _log("start", case_id)
    if case_id.startswith("slow"):
        time.sleep(SLOW)
    _log("end", case_id)
    return _reply(question)

async def achat(question, case_id, history):
    _log("start", case_id)
    if case_id.startswith("slow"):
        await asyncio.sleep(SLOW)
    _log("end", case_id)
    return _reply(question)
"""

CHATS = [
    {"id": "slow", "turns": [{"question": "s1", "relevant_ids": ["d0"]}, {"question": "s2", "relevant_ids": ["d0"]}]},
    {"id": "quick", "turns": [{"question": f"q{t}", "relevant_ids": ["d0"]} for t in range(1, 4)]},
]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.parametrize("target", ["chat", "achat"])
def test_a_conversations_next_turn_does_not_wait_for_other_conversations(
    ragexp: Any, tmp_path: Path, target: str
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    module = f"sched_chat_{target}"  # one module per case: an imported module is kept between runs
    (code / f"{module}.py").write_text(TARGET, encoding="utf-8")
    data = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    result = ragexp(
        "run",
        f"dataset.path={data}",
        "system=python",
        f"provider.system.target={module}:{target}",
        f"provider.system.path={code}",
        "metrics.names=[recall_at_k]",
        "k=1",
        "concurrency=2",
        "--json",
    )
    assert result.code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["case_count"] == 5 and payload["error_count"] == 0
    log = (code / "calls.log").read_text(encoding="utf-8").split("\n")[:-1]
    # The quick conversation's three turns are all asked and answered while the slow
    # conversation's first turn is still out; its second turn comes after its first.
    assert log.index("end quick#3") < log.index("end slow#1") < log.index("start slow#2")
    assert log.index("end quick#1") < log.index("start quick#2") < log.index("end quick#2") < log.index("start quick#3")
