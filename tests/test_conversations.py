"""Conversations: multi-turn cases, asked turn by turn with their history, scored per turn and per
conversation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from tests.conftest import ROOT, write_jsonl

CONV = {
    "id": "conv-7",
    "turns": [
        {"question": "退货怎么办？", "relevant_ids": ["return-policy"], "reference": "七天内可退货。"},
        {"question": "那运费呢？", "relevant_ids": ["return-shipping"], "expected_facts": ["运费"]},
    ],
}
SINGLE = {"id": "a", "question": "退款多久到账？", "relevant_ids": ["refund-arrival"]}


def first_error(path: Path) -> str:
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    return str(info.value.errors[0])


def test_conversation_turns_are_cases_beside_single_questions(tmp_path: Path) -> None:
    data = load_dataset(write_jsonl(tmp_path / "d.jsonl", [SINGLE, CONV]))
    assert [c.id for c in data.cases] == ["a", "conv-7#1", "conv-7#2"]
    first, second = data.cases[1], data.cases[2]
    assert (first.conversation, first.turn, first.line) == ("conv-7", 1, 2)
    assert (second.conversation, second.turn, second.question) == ("conv-7", 2, "那运费呢？")
    assert second.relevant_ids == ["return-shipping"] and second.expected_facts == ["运费"]
    assert data.cases[0].conversation is None and data.cases[0].turn == 0
    assert data.has_conversations


def test_dataset_hash_covers_the_turns(tmp_path: Path) -> None:
    base = load_dataset(write_jsonl(tmp_path / "a.jsonl", [CONV])).dataset_hash
    changed = {**CONV, "turns": [CONV["turns"][0], {**CONV["turns"][1], "question": "那保价呢？"}]}
    assert load_dataset(write_jsonl(tmp_path / "b.jsonl", [changed])).dataset_hash != base
    shorter = {**CONV, "turns": CONV["turns"][:1]}
    assert load_dataset(write_jsonl(tmp_path / "c.jsonl", [shorter])).dataset_hash != base
    # The same question asked alone is not the same case as that turn of a conversation.
    alone = {
        "id": "conv-7#1",
        "question": "退货怎么办？",
        "relevant_ids": ["return-policy"],
        "reference": "七天内可退货。",
    }
    assert (
        load_dataset(write_jsonl(tmp_path / "d.jsonl", [alone])).dataset_hash
        != load_dataset(write_jsonl(tmp_path / "e.jsonl", [shorter])).dataset_hash
    )


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"id": "c", "turns": []}, "d.jsonl:2: field 'turns': required: a non-empty list of turns"),
        (
            {"id": "c", "turns": "hi"},
            "d.jsonl:2: field 'turns': required: a non-empty list of turns ({question, ...}), got a string",
        ),
        (
            {"id": "c", "turns": [{"relevant_ids": ["x"]}]},
            "d.jsonl:2: field 'turns[0].question': required: every turn asks a question",
        ),
        (
            {"id": "c", "turns": [{"question": "q", "relevant_ids": ["x"]}, {"question": "q2", "relevant_id": ["x"]}]},
            "d.jsonl:2: field 'turns[1].relevant_id': not a field of a turn (did you mean 'relevant_ids'?)",
        ),
        (
            {"id": "c", "turns": [{"question": "q", "relevant_ids": ["x"], "response": "r"}]},
            "d.jsonl:2: field 'turns[0].response': not a field of a turn",
        ),
        (
            {"id": "c", "turns": [{"question": "q"}]},
            "d.jsonl:2: field 'turns[0].relevant_ids': an answerable case needs",
        ),
        ({"id": "c", "turns": [{"question": 3, "unanswerable": True}]}, "field 'turns[0].question': expected a string"),
        ({"id": "c", "turns": ["q"]}, "d.jsonl:2: field 'turns[0]': expected an object {question, ...}, got a string"),
        ({"turns": [{"question": "q", "unanswerable": True}]}, "d.jsonl:2: field 'id': required: a non-empty string"),
        (
            {"id": "c", "question": "q", "turns": [{"question": "q", "unanswerable": True}]},
            "d.jsonl:2: field 'question': not a field of a conversation (a turn's field goes inside its item of turns)",
        ),
        ({**CONV, "id": "a"}, "d.jsonl:2: field 'id': duplicate id 'a' (first on line 1)"),
    ],
)
def test_refusals_name_file_line_and_field(tmp_path: Path, row: dict[str, object], expected: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [SINGLE, row]), encoding="utf-8")
    assert expected in first_error(path)


def test_a_single_case_cannot_take_a_turn_id(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [CONV, {**SINGLE, "id": "conv-7#2"}])
    assert "d.jsonl:2: field 'id': duplicate id 'conv-7#2' (first on line 1)" in first_error(path)


def test_a_reused_conversation_id_is_named_as_such_not_as_a_turn(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [CONV, SINGLE, CONV])
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    assert [str(error) for error in info.value.errors] == [
        f"{path}:3: field 'id': duplicate id 'conv-7' (first on line 1)"
    ]


# --- asked turn by turn, end to end ----------------------------------------------------------------

from typing import Any  # noqa: E402

from mlflow.tracking import MlflowClient  # noqa: E402

from tests.pipelines import chat  # noqa: E402

CHATS = [
    {"id": "alone", "question": "满多少包邮？", "relevant_ids": ["shipping-fee"]},
    {
        "id": "conv-ret",
        "turns": [
            {"question": "退货怎么办？", "relevant_ids": ["return-policy"], "reference": "签收后七天内可退货。"},
            {"question": "那运费呢？", "relevant_ids": ["return-fee"], "reference": "退货运费由买家承担。"},
        ],
    },
    {
        "id": "conv-inv",
        "turns": [
            {"question": "怎么开发票？", "relevant_ids": ["invoice-types"], "reference": "可开电子普通发票。"},
            {"question": "多久能收到？", "relevant_ids": ["invoice-time"]},
        ],
    },
]
TURN_IDS = ["alone", "conv-ret#1", "conv-ret#2", "conv-inv#1", "conv-inv#2"]


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    chat.HISTORIES.clear()
    chat.FAIL.clear()
    chat.INTERRUPT.clear()
    chat.CALLS.clear()
    return write_jsonl(tmp_path / "chats.jsonl", CHATS)


def run_chat(ragexp: Any, data: Path, target: str, *overrides: str) -> Any:
    return ragexp(
        "run",
        f"dataset.path={data}",
        "system=python",
        f"provider.system.target=tests.pipelines.chat:{target}",
        "metrics.names=[recall_at_k,mrr]",
        "k=1",
        *overrides,
        "--json",
    )


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_a_target_that_needs_the_history_gets_it_and_is_scored_per_turn(
    ragexp: Any, store_uri: str, chats: Path, tmp_path: Path
) -> None:
    result = run_chat(ragexp, chats, "remembers")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["case_count"] == 5 and payload["error_count"] == 0
    assert payload["summary"]["recall_at_k"] == 1.0
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert list(rows) == TURN_IDS
    assert {key: (rows[key].get("conversation"), rows[key].get("turn")) for key in rows} == {
        "alone": (None, None),
        "conv-ret#1": ("conv-ret", 1),
        "conv-ret#2": ("conv-ret", 2),
        "conv-inv#1": ("conv-inv", 1),
        "conv-inv#2": ("conv-inv", 2),
    }
    assert all(row["metrics"]["recall_at_k"] == 1.0 for row in rows.values())
    # What the target received: nothing before a first turn, then the question and its own answer.
    assert chat.HISTORIES["alone"] == [] and chat.HISTORIES["conv-ret#1"] == [] and chat.HISTORIES["conv-inv#1"] == []
    assert chat.HISTORIES["conv-ret#2"] == [
        {"role": "user", "content": "退货怎么办？"},
        {"role": "assistant", "content": chat.DOCS["return-policy"]},
    ]
    assert chat.HISTORIES["conv-inv#2"] == [
        {"role": "user", "content": "怎么开发票？"},
        {"role": "assistant", "content": chat.DOCS["invoice-types"]},
    ]


def test_the_same_target_ignoring_the_history_misses_the_follow_ups(
    ragexp: Any, store_uri: str, chats: Path, tmp_path: Path
) -> None:
    result = run_chat(ragexp, chats, "forgets")
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert {key: row["metrics"]["recall_at_k"] for key, row in rows.items()} == {
        "alone": 1.0,
        "conv-ret#1": 1.0,
        "conv-ret#2": 0.0,
        "conv-inv#1": 1.0,
        "conv-inv#2": 0.0,
    }
    assert result.json()["summary"]["recall_at_k"] == pytest.approx(3 / 5)


def test_history_reference_carries_the_reference_answers(ragexp: Any, chats: Path) -> None:
    result = run_chat(ragexp, chats, "remembers", "conversation.history=reference")
    assert result.code == 0, result.stderr
    assert chat.HISTORIES["conv-ret#2"] == [
        {"role": "user", "content": "退货怎么办？"},
        {"role": "assistant", "content": "签收后七天内可退货。"},
    ]


def test_history_reference_refuses_a_turn_without_a_reference(ragexp: Any, chats: Path, tmp_path: Path) -> None:
    rows = [
        {**CHATS[2], "turns": [{"question": "怎么开发票？", "relevant_ids": ["invoice-types"]}, CHATS[2]["turns"][1]]}
    ]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    result = run_chat(ragexp, data, "remembers", "conversation.history=reference")
    assert result.code == 1
    assert "conversation.history=reference: turn conv-inv#1 (" in result.stderr
    assert "d.jsonl:1, field 'turns[0].reference') has no reference answer" in result.stderr
    assert chat.CALLS == {}


def test_a_failed_turn_is_an_error_for_it_and_the_later_turns(
    ragexp: Any, store_uri: str, chats: Path, tmp_path: Path
) -> None:
    chat.FAIL.add("conv-ret#1")
    result = run_chat(ragexp, chats, "remembers")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 2
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert "model overloaded on conv-ret#1" in rows["conv-ret#1"]["error"]
    assert rows["conv-ret#2"]["error"] == "not asked: turn conv-ret#1 of its conversation failed"
    assert rows["conv-ret#2"]["metrics"]["recall_at_k"] is None
    assert "conv-ret#2" not in chat.CALLS  # never asked without the turn it follows
    assert payload["summary"]["recall_at_k"] == 1.0  # over the 3 scored turns, never a 0 for an error


def test_resume_asks_a_conversation_cut_in_its_second_turn_again_from_its_first(
    ragexp: Any, store_uri: str, chats: Path, tmp_path: Path
) -> None:
    chat.INTERRUPT.add("conv-ret#2")
    args = ["run", f"dataset.path={chats}", "system=python", "provider.system.target=tests.pipelines.chat:remembers"]
    args += ["metrics.names=[recall_at_k,mrr]", "k=1", "concurrency=1"]
    first = ragexp(*args, "--json")
    assert first.code == 130, first.stderr
    run_id = (
        MlflowClient(store_uri)
        .search_runs([MlflowClient(store_uri).get_experiment_by_name("ragexp").experiment_id])[0]
        .info.run_id
    )
    before = dict(chat.CALLS)
    assert before["conv-ret#2"] == 1
    resumed = ragexp(*args, "--resume", run_id, "--json")
    assert resumed.code == 0, resumed.stderr
    again = {key: chat.CALLS[key] - before.get(key, 0) for key in chat.CALLS}
    assert again["alone"] == 0  # answered before the cut: kept
    assert again["conv-ret#1"] == 1 and again["conv-ret#2"] == 1  # the cut conversation, from its first turn
    assert resumed.json()["case_count"] == 5 and resumed.json()["error_count"] == 0
    assert chat.HISTORIES["conv-ret#2"][0] == {"role": "user", "content": "退货怎么办？"}
    rows = rows_of(store_uri, run_id, tmp_path)
    assert all(row["metrics"]["recall_at_k"] == 1.0 for row in rows.values())


def conversation_rows(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "conversations.jsonl", str(tmp_path / f"c-{run_id}"))
    return {row["conversation"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_per_conversation_figures_all_turns_correct_and_the_first_failed_turn(
    ragexp: Any, store_uri: str, chats: Path, tmp_path: Path
) -> None:
    three = {
        "id": "conv-three",
        "turns": [
            {"question": "怎么开发票？", "relevant_ids": ["invoice-types"]},
            {"question": "满多少包邮？", "relevant_ids": ["shipping-fee"]},
            {"question": "多久能收到？", "relevant_ids": ["arrival"]},
        ],
    }
    data = write_jsonl(tmp_path / "d.jsonl", [*CHATS, three])
    forgot = run_chat(ragexp, data, "forgets")
    assert forgot.code == 0, forgot.stderr
    payload = forgot.json()
    figures = {key: payload["conversations"][key] for key in ("count", "turns", "errored", "all_correct")}
    assert figures == {"count": 3, "turns": 7, "errored": 0, "all_correct": pytest.approx(1 / 3)}
    rows = conversation_rows(store_uri, payload["run_id"], tmp_path)
    # The same rows in --json (by_conversation), and the turns by their position (tests/test_first_hour.py).
    assert {row["conversation"]: row for row in payload["conversations"]["by_conversation"]} == rows
    assert sum(p["cases"] for p in payload["conversations"]["by_turn"]) == 7
    assert rows["conv-ret"] == {
        "conversation": "conv-ret",
        "turns": 2,
        "all_correct": False,
        "first_failed_turn": 2,
        "errored_turn": None,
    }
    assert rows["conv-three"]["all_correct"] is True and rows["conv-three"]["first_failed_turn"] is None
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert metrics["conversations.count"] == 3 and metrics["conversations.turns"] == 7
    assert metrics["conversations.all_correct"] == pytest.approx(1 / 3)
    chat.FAIL.add("conv-inv#1")
    failed = run_chat(ragexp, data, "remembers")
    rows = conversation_rows(store_uri, failed.json()["run_id"], tmp_path)
    # An errored turn makes its conversation an error, never a failed conversation.
    assert rows["conv-inv"] == {
        "conversation": "conv-inv",
        "turns": 2,
        "all_correct": None,
        "first_failed_turn": None,
        "errored_turn": 1,
    }
    assert failed.json()["conversations"]["errored"] == 1
    text = ragexp(
        "run",
        f"dataset.path={data}",
        "system=python",
        "provider.system.target=tests.pipelines.chat:forgets",
        "metrics.names=[recall_at_k,mrr]",
        "k=1",
    )
    assert "3 conversations, 7 turns: every turn correct in 1 of 3" in text.stdout


def test_the_judge_reads_each_turn_after_the_conversation_so_far(ragexp: Any, chats: Path) -> None:
    import urllib.request

    from tests.conftest import ROOT
    from tests.servers.procs import serve

    rubric = (
        "{name: on_topic, kind: judge, rubric: 'the answer is about what the user asks', needs: [question, answer]}"
    )
    with serve(ROOT / "tests/servers/judge.py") as url:
        result = run_chat(
            ragexp,
            chats,
            "remembers",
            "judge=openai",
            f"provider.judge.base_url={url}",
            "provider.judge.api_key_env=null",
            "provider.judge.max_retries=0",
            f"metrics.custom=[{rubric}]",
        )
        with urllib.request.urlopen(f"{url}/prompts", timeout=5) as reply:
            prompts = json.loads(reply.read())
    assert result.code == 0, result.stderr
    assert result.json()["error_count"] == 0 and len(prompts) == 5
    follow_up = [prompt for prompt in prompts if "那运费呢？" in prompt]
    assert len(follow_up) == 1
    said = json.loads(follow_up[0].split("input: ", 1)[1])["question"]
    assert (
        said
        == f"[conversation so far]\nuser: 退货怎么办？\nassistant: {chat.DOCS['return-policy']}\n[question]\n那运费呢？"
    )
    alone = [prompt for prompt in prompts if "满多少包邮？" in prompt]
    assert json.loads(alone[0].split("input: ", 1)[1])["question"] == "满多少包邮？"


# --- the bundled conversations ----------------------------------------------------------------------


def test_bundled_kb_zh_chat_follow_ups_need_their_history(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from ragexp.config.compose import compose
    from ragexp.datasets.loader import resolve_path
    from ragexp.paths import data_roots

    config = compose(["dataset=kb_zh_chat"])
    data = load_dataset(resolve_path(config.dataset.path, data_roots()))
    docs = {row["id"]: row["text"] for row in map(json.loads, (ROOT / "ragexp/data/kb_zh/docs.jsonl").open())}
    turns: dict[str, list[Any]] = {}
    for case in data.cases:
        assert case.conversation is not None and case.relevant_ids and case.expected_facts and case.reference
        for doc in case.relevant_ids:
            assert doc in docs and all(fact in docs[doc] for fact in case.expected_facts), case.id
        turns.setdefault(case.conversation, []).append(case)
    assert len(turns) >= 12 and all(2 <= len(chat) <= 4 for chat in turns.values())
    assert any(case.question == "那运费呢？" for case in data.cases)
    result = ragexp("run", "dataset=kb_zh_chat", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["conversations"]["count"] == len(turns) and payload["case_count"] == len(data.cases)
    # The same questions asked one by one, without the turns before them.
    alone = [
        {
            "id": case.id.replace("#", "-"),
            "question": case.question,
            "relevant_ids": case.relevant_ids,
            "expected_facts": case.expected_facts,
        }
        for case in data.cases
    ]
    flat = ragexp("run", f"dataset.path={write_jsonl(tmp_path / 'alone.jsonl', alone)}", "--json")
    assert flat.code == 0, flat.stderr
    with_history = rows_of(store_uri, payload["run_id"], tmp_path)
    without = rows_of(store_uri, flat.json()["run_id"], tmp_path)
    follow_ups = [case.id for case in data.cases if case.turn > 1]
    helped = [
        key
        for key in follow_ups
        if with_history[key]["metrics"]["answer_accuracy"]
        > without[key.replace("#", "-")]["metrics"]["answer_accuracy"]
    ]
    hurt = [
        key
        for key in follow_ups
        if with_history[key]["metrics"]["answer_accuracy"]
        < without[key.replace("#", "-")]["metrics"]["answer_accuracy"]
    ]
    assert len(helped) >= 8 and hurt == []
    first_turns = [case.id for case in data.cases if case.turn == 1]
    assert all(with_history[key]["metrics"] == without[key.replace("#", "-")]["metrics"] for key in first_turns)
    assert payload["summary"]["answer_accuracy"] > flat.json()["summary"]["answer_accuracy"] + 0.15


# --- statistics by conversation -----------------------------------------------------------------------


def test_diff_gate_and_power_count_and_resample_conversations(ragexp: Any, store_uri: str, chats: Path) -> None:
    from ragexp.stats.paired import paired_differences

    base = run_chat(ragexp, chats, "remembers", "+tags.role=baseline").json()["run_id"]
    cand = run_chat(ragexp, chats, "forgets").json()["run_id"]
    found = ragexp("diff", base, cand, "--seed", "3", "--json")
    assert found.code == 0, found.stderr
    recall = next(m for m in found.json()["metrics"] if m["name"] == "recall_at_k")
    # Three units: the single question and the two conversations (whose 4 turns count as 2).
    assert (recall["n"], recall["unit"]) == (3, "conversation")
    assert recall["improved"] + recall["regressed"] + recall["unchanged"] == 5
    # The test runs on each unit's mean difference: alone 0, conv-ret (0 - 1)/2, conv-inv (0 - 1)/2.
    expected = paired_differences(np.array([0.0, -0.5, -0.5]), resamples=10000, confidence=0.95, seed=3)
    assert expected is not None
    assert recall["p_value"] == pytest.approx(expected[0])
    assert (recall["ci_low"], recall["ci_high"]) == (None, None)  # 3 units: no finite 95% interval
    assert recall["delta"] == pytest.approx(-2 / 5)  # the logged means stay the means over turns
    text = ragexp("diff", base, cand)
    assert "(2 conversations, 4 turns, 1 single question (paired by conversation))" in text.stdout
    planned = ragexp("power", "--baseline", base, "--json")
    assert planned.code == 0, planned.stderr
    plan = next(p for p in planned.json()["metrics"] if p["name"] == "recall_at_k")
    assert (plan["n"], plan["unit"]) == (3, "conversation")
    gate = ragexp("gate", "--baseline", base, "--candidate", cand)
    assert gate.code == 2
    assert "with 3 conversations" in gate.stdout


def test_the_bundled_conversations_are_paired_by_conversation(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from ragexp.stats.paired import paired_differences

    base = ragexp("run", "dataset=kb_zh_chat", "--json").json()["run_id"]
    cand = ragexp("run", "dataset=kb_zh_chat", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    found = ragexp("diff", base, cand, "--json")
    assert found.code == 0, found.stderr
    b_rows, c_rows = rows_of(store_uri, base, tmp_path), rows_of(store_uri, cand, tmp_path)
    by_chat: dict[str, list[float]] = {}
    for key, row in b_rows.items():
        change = c_rows[key]["metrics"]["mrr"] - row["metrics"]["mrr"]
        by_chat.setdefault(row["conversation"], []).append(change)
    means = np.array([np.mean(values) for values in by_chat.values()])
    mrr = next(m for m in found.json()["metrics"] if m["name"] == "mrr")
    assert (mrr["n"], mrr["unit"]) == (16, "conversation")
    expected = paired_differences(means, resamples=10000, confidence=0.95, seed=0)
    assert expected is not None and any(means != 0)
    assert (mrr["p_value"], mrr["ci_low"], mrr["ci_high"]) == pytest.approx(expected)
    text = ragexp("diff", base, cand).stdout
    assert "(16 conversations, 43 turns (paired by conversation))" in text


# --- MLflow -------------------------------------------------------------------------------------------


def test_each_turn_is_a_trace_in_its_conversations_session(ragexp: Any, store_uri: str, chats: Path) -> None:
    from mlflow.tracing.constant import TraceMetadataKey

    result = run_chat(ragexp, chats, "remembers")
    assert result.code == 0, result.stderr
    again = run_chat(ragexp, chats, "remembers")  # the same conversations, another run, one experiment
    assert again.code == 0, again.stderr
    run_id = result.json()["run_id"]
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp").experiment_id
    name = f"conv-ret@{run_id}"  # the session names the run and the conversation
    session = client.search_traces(
        locations=[experiment], filter_string=f"metadata.`{TraceMetadataKey.TRACE_SESSION}` = '{name}'"
    )
    cases = sorted(json.loads(trace.info.request_preview)["case_id"] for trace in session)
    assert cases == ["conv-ret#1", "conv-ret#2"]  # this run's turns only
    assert {t.info.request_metadata["mlflow.sourceRun"] for t in session} == {run_id}
    second = next(t for t in session if json.loads(t.info.request_preview)["case_id"] == "conv-ret#2")
    full = client.get_trace(second.info.trace_id)
    assert full.info.trace_metadata[TraceMetadataKey.TRACE_SESSION] == name
    assert {a.name for a in full.info.assessments} >= {"recall_at_k", "mrr"}
    root = next(span for span in full.data.spans if span.parent_id is None)
    assert root.inputs["history"] == [
        {"role": "user", "content": "退货怎么办？"},
        {"role": "assistant", "content": chat.DOCS["return-policy"]},
    ]
    everything = client.search_traces(locations=[experiment], max_results=50)
    alone = next(t for t in everything if json.loads(t.info.request_preview)["case_id"] == "alone")
    assert TraceMetadataKey.TRACE_SESSION not in alone.info.trace_metadata


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_long_conversations_traces_grow_with_its_turns_not_their_square(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from mlflow.tracing.constant import TraceMetadataKey

    from ragexp.records import SPAN_TEXT_CHARS as HISTORY_CHARS  # the history budget: one text's

    turns = 30
    long = "七天内可退货。" * 700  # 4,900 characters, each turn's reference answer
    row = {
        "id": "long",
        "turns": [
            {"question": f"第 {n} 个问题？", "relevant_ids": ["return-policy"], "reference": long} for n in range(turns)
        ],
    }
    data = write_jsonl(tmp_path / "long.jsonl", [row])
    result = run_chat(ragexp, data, "remembers", "conversation.history=reference")
    assert result.code == 0, result.stderr
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp").experiment_id
    name = f"long@{result.json()['run_id']}"  # the session names the conversation and the run
    session = client.search_traces(
        locations=[experiment], filter_string=f"metadata.`{TraceMetadataKey.TRACE_SESSION}` = '{name}'", max_results=50
    )
    assert len(session) == turns
    shown = {}
    for found in session:
        root = next(span for span in client.get_trace(found.info.trace_id).data.spans if span.parent_id is None)
        turn = int(root.inputs["case_id"].split("#")[1])
        history = root.inputs["history"]
        shown[turn] = sum(len(message["content"]) for message in history)
        assert len(history) + root.inputs.get("history_left_out", 0) == 2 * (turn - 1)
        if history:  # the latest messages, the last the turn just before
            assert history[-1] == {"role": "assistant", "content": long}
    assert max(shown.values()) <= HISTORY_CHARS + 100
    # Below what every turn's whole history would hold over the conversation.
    assert sum(shown.values()) <= turns * (HISTORY_CHARS + 100) < sum(2 * (t - 1) * (len(long) + 6) for t in shown)
    assert shown[2] == len("第 0 个问题？") + len(long)


# --- services that keep the conversation themselves ------------------------------------------------

SERVICE_CHATS = [
    {
        "id": "chat-a",
        "turns": [
            {"question": "what about 3?", "relevant_ids": ["seg-3"], "expected_facts": ["fact 3"]},
            {"question": "那它呢？", "relevant_ids": ["seg-3"], "expected_facts": ["fact 3"]},
            {"question": "and then?", "relevant_ids": ["seg-3"], "expected_facts": ["fact 3"]},
        ],
    },
    {
        "id": "chat-b",
        "turns": [
            {"question": "tell me 7?", "relevant_ids": ["seg-7"], "expected_facts": ["fact 7"]},
            {"question": "那它呢？", "relevant_ids": ["seg-7"], "expected_facts": ["fact 7"]},
        ],
    },
]


def sessions(url: str) -> dict[str, list[str]]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/sessions", timeout=5) as reply:
        found: dict[str, list[str]] = json.loads(reply.read())
    return found


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.parametrize(
    ("system", "path", "secret"),
    [
        ("dify", "/v1/chat-messages", ("RAGEXP_DIFY_AUTH", "Bearer app-standin")),
        ("ragflow", "/api/v1/chats/standin/completions", ("RAGEXP_RAGFLOW_AUTH", "Bearer ragflow-standin")),
    ],
)
def test_dify_and_ragflow_carry_the_conversation_id_they_issued(
    ragexp: Any,
    store_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    system: str,
    path: str,
    secret: tuple[str, str],
) -> None:
    from tests.servers.procs import serve

    monkeypatch.setenv(*secret)
    data = write_jsonl(tmp_path / "chats.jsonl", SERVICE_CHATS)
    metrics = "metrics.names=[recall_at_k,answer_accuracy]"
    with serve(ROOT / f"tests/servers/{system}.py") as url:
        result = ragexp(
            "run", f"system={system}", f"provider.system.url={url}{path}", f"dataset.path={data}", metrics, "--json"
        )
        kept = sessions(url)
        # The same service without the id: each turn starts a conversation of its own.
        forgetful = ragexp(
            "run",
            f"system={system}",
            f"provider.system.url={url}{path}",
            f"dataset.path={data}",
            metrics,
            "provider.system.response.conversation_id=null",
            "--json",
        )
    assert result.code == 0, result.stderr
    assert result.json()["error_count"] == 0 and result.json()["summary"]["answer_accuracy"] == 1.0
    # One conversation on the service per conversation of the dataset, its turns in order.
    assert sorted(kept.values()) == [["tell me 7?", "那它呢？"], ["what about 3?", "那它呢？", "and then?"]]
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["chat-a#1"]["output"]["conversation_id"] == rows["chat-a#3"]["output"]["conversation_id"]
    assert rows["chat-a#1"]["output"]["conversation_id"] != rows["chat-b#1"]["output"]["conversation_id"]
    assert forgetful.code == 0, forgetful.stderr
    alone = rows_of(store_uri, forgetful.json()["run_id"], tmp_path)
    assert {key: row["metrics"]["answer_accuracy"] for key, row in alone.items()} == {
        "chat-a#1": 1.0,
        "chat-a#2": 0.0,
        "chat-a#3": 0.0,
        "chat-b#1": 1.0,
        "chat-b#2": 0.0,
    }


def test_an_id_the_service_never_issued_is_an_error_for_that_conversation(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servers.procs import serve

    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    data = write_jsonl(tmp_path / "chats.jsonl", SERVICE_CHATS)
    with serve(ROOT / "tests/servers/dify.py") as url:
        result = ragexp(
            "run",
            "system=dify",
            f"provider.system.url={url}/v1/chat-messages",
            f"dataset.path={data}",
            "metrics.names=[recall_at_k,answer_accuracy]",
            "provider.system.response.conversation_id=task_id",  # a wrong expression: not the conversation
            "--json",
        )
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert "Conversation Not Exists." in rows["chat-a#2"]["error"]
    assert rows["chat-a#3"]["error"] == "not asked: turn chat-a#2 of its conversation failed"
    assert result.json()["error_count"] == 3  # chat-a#2, chat-a#3 and chat-b#2


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_conversation_id_mapping_that_finds_nothing_is_an_error_and_fails_the_probe(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servers.procs import serve

    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    single = {"id": "alone", "question": "what about 5?", "relevant_ids": ["seg-5"], "expected_facts": ["fact 5"]}
    data = write_jsonl(tmp_path / "chats.jsonl", [single, *SERVICE_CHATS])
    given = ["system=dify", f"dataset.path={data}", "metrics.names=[recall_at_k,answer_accuracy]"]
    wrong = "provider.system.response.conversation_id=conversation"  # the service's key is conversation_id
    with serve(ROOT / "tests/servers/dify.py") as url:
        at = f"provider.system.url={url}/v1/chat-messages"
        result = ragexp("run", *given, at, wrong, "--json")
        probed = ragexp("validate", *given, at, wrong, "--probe", "--json")
        right = ragexp("validate", *given, at, "--probe", "--json")
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    said = (
        "conversation_id ('conversation') found nothing in the reply: the next turns of conversation chat-a would "
        "each start a new conversation"
    )
    assert said in rows["chat-a#1"]["error"]
    assert rows["chat-a#2"]["error"] == "not asked: turn chat-a#1 of its conversation failed"
    assert rows["alone"]["error"] is None and rows["alone"]["metrics"]["answer_accuracy"] == 1.0
    assert result.json()["error_count"] == 5  # every turn; the single question needs no conversation id
    assert probed.code == 1
    probe = probed.json()["probe"]
    assert probe["case_id"] == "chat-a#1" and said in probe["error"]
    assert right.code == 0, right.stdout


def test_openai_chat_sends_the_conversation_as_its_messages(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.servers.procs import serve

    monkeypatch.setenv("RAGEXP_OPENAI_AUTH", "Bearer sk-standin")
    data = write_jsonl(tmp_path / "chats.jsonl", SERVICE_CHATS)
    with serve(ROOT / "tests/servers/openai_chat.py") as url:
        result = ragexp(
            "run",
            "system=openai_chat",
            f"provider.system.url={url}/v1/chat/completions",
            "provider.system.request.model=standin-model",
            f"dataset.path={data}",
            "metrics.names=[answer_accuracy]",
            "--json",
        )
    assert result.code == 0, result.stderr
    assert result.json()["summary"]["answer_accuracy"] == 1.0
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["chat-b#2"]["output"]["answer"] == "fact 7 is documented."


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_subset_takes_whole_conversations_and_refuses_a_turn_without_its_earlier_turns(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    cut = ragexp("run", "dataset=kb_zh_chat", "dataset.case_ids=['chat-warranty#2']", "--json")
    assert cut.code == 1
    assert cut.stderr.strip().splitlines() == [
        "ragexp: error: config: dataset.case_ids: turn chat-warranty#2 follows chat-warranty#1, not chosen: a turn "
        "is asked after the turns before it; choose them too, or the whole conversation ('chat-warranty')"
    ]
    later = ragexp("run", "dataset=kb_zh_chat", "dataset.case_ids=['chat-warranty#1','chat-warranty#3']")
    assert later.code == 1 and "turn chat-warranty#3 follows chat-warranty#2, not chosen" in later.stderr
    full = ragexp("run", "dataset=kb_zh_chat", "--json")
    whole = ragexp("run", "dataset=kb_zh_chat", "dataset.case_ids=[chat-warranty]", "--json")
    prefix = ragexp("run", "dataset=kb_zh_chat", "dataset.case_ids=['chat-warranty#1','chat-warranty#2']", "--json")
    assert full.code == whole.code == prefix.code == 0, whole.stderr + prefix.stderr
    every = rows_of(store_uri, full.json()["run_id"], tmp_path)
    chosen = rows_of(store_uri, whole.json()["run_id"], tmp_path)
    assert list(chosen) == ["chat-warranty#1", "chat-warranty#2", "chat-warranty#3"]
    assert all(row["metrics"] == every[key]["metrics"] for key, row in chosen.items())
    assert every["chat-warranty#2"]["metrics"]["answer_accuracy"] == 1.0  # asked after its first turn
    first_two = rows_of(store_uri, prefix.json()["run_id"], tmp_path)
    assert list(first_two) == ["chat-warranty#1", "chat-warranty#2"]
    assert all(row["metrics"] == every[key]["metrics"] for key, row in first_two.items())
