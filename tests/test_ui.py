"""The per-case comparison in the real MLflow UI, opened in Debian's headless Chromium: runs
written straight into a SQLite store (served by an `mlflow server` of this test's own over that
store) and runs logged through the session's tracking server.

The page is read through Chromium's DevTools protocol: the test polls the live DOM until what it
asserts is on the page (the virtualised table renders its rows some time after the page loads,
later still on a loaded machine), within a bounded wait, then asserts on that DOM."""

from __future__ import annotations

import base64
import html
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from ragexp.metrics.registry import METRICS
from tests.test_traces import case_id, rows_of, traces_of

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
MLFLOW = [sys.executable, "-m", "mlflow"]
SERVE = ["--host", "127.0.0.1", "--workers", "1"]
PAGE_WAIT_S = 240.0
"""How long a page may take to show what a test waits for (a loaded 2-core machine is slow)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def ui_server(store_uri: str, tmp_path: Path) -> Iterator[str]:
    """An `mlflow server` of the test's own over its SQLite store (for runs written straight into it)."""
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [*MLFLOW, "server", "--backend-store-uri", store_uri, *SERVE, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: the test's result stands, the server goes
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def render(chromium: str, url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium process over ``url`` (``--dump-dom``, ``--screenshot=...``)."""
    return subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=60000",
            "--window-size=1600,1100",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def text_of(dom: str) -> str:
    """The page's text, one ``|`` between elements, scripts and styles left out."""
    text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " | ", text))
    return re.sub(r"(\s*\|\s*)+", " | ", text)


class Page:
    """A page open in headless Chromium, driven over the DevTools protocol."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        sent = next(self._ids)
        self._ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=120))
            if message.get("id") == sent:
                assert "error" not in message, message
                return dict(message.get("result", {}))

    def dom(self) -> str:
        found = self.call("Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True)
        return str(found.get("result", {}).get("value", ""))

    def wait_for(self, done: Callable[[str], bool], what: str) -> str:
        """The page's text once ``done(text)`` holds; fails naming ``what`` after PAGE_WAIT_S."""
        deadline = time.monotonic() + PAGE_WAIT_S
        while True:
            text = text_of(self.dom())
            if done(text):
                return text
            assert time.monotonic() < deadline, f"the page never showed {what}: {text[:3000]}"
            time.sleep(1)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Callable[[str], Page]]:
    """``page(url)``: ``url`` open in a headless Chromium of the test's own (closed afterwards)."""
    from websockets.sync.client import connect

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed (make browser installs it)"
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--window-size=1600,1100",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sockets: list[Any] = []

    def open_page(url: str) -> Page:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 120
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=30).json()
        target = next(t for t in targets if t.get("type") == "page")
        ws = connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=60)
        sockets.append(ws)
        opened = Page(ws)
        opened.call("Page.enable")
        opened.call("Page.navigate", url=url)
        return opened

    try:
        yield open_page
    finally:
        for ws in sockets:
            ws.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


# A row of the evaluation table: the case's request, then the candidate's and the baseline's
# trace of that very case.
ROW = re.compile(r'"case_id": "([^"]+)",\s*"question": "[^"]*"\s*\} \| [^|]+ \| [^|]+ \| (tr-\w+) \| (tr-\w+)')
AVG = re.compile(r"\| answer_accuracy \| AVG \| ([-\d.]+) \| ([-+\d.]+) \|")
COMPARING = re.compile(r"Comparing \| #\w+ \| candidate \| to \| #\w+ \| baseline")
# The unanswerable case both runs refused: 1 and 1 in its row.
REFUSED = re.compile(r'"case_id": "sf-u1"(?:(?!"case_id").)*?\| true \| true \| 1 \| 1 \|', re.S)


def comparison_shown(text: str) -> bool:
    """Everything the test asserts is on the page: the header, the averages, five paired rows."""
    return all(p.search(text) for p in (COMPARING, AVG, REFUSED)) and len(ROW.findall(text)) >= 5


@pytest.mark.parametrize("logged_via", ["store", "server"])
def test_evaluation_runs_comparison_shows_cases_paired_with_assessments(
    ragexp: Any,
    store_uri: str,
    request: pytest.FixtureRequest,
    page: Callable[[str], Page],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logged_via: str,
) -> None:
    """``store``: the runs are written straight into the SQL store (one transaction per batch),
    which a server of the test's own serves; ``server``: through the session's tracking server
    (StartTraceV3 requests and OTLP span batches), the one CI starts when it is there."""
    ui = request.getfixturevalue("ui_server" if logged_via == "store" else "server")
    uri = store_uri if logged_via == "store" else ui
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    experiment_name = f"ui-{logged_via}-{time.time_ns()}"
    common = ["dataset=scifacts_zh", f"experiment={experiment_name}", "--json"]
    base = ragexp("run", "provider=fake", "run_name=baseline", "+tags.role=baseline", *common)
    cand = ragexp("run", "provider=replay", "run_name=candidate", *common)
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    experiment = httpx.get(
        ui + "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": experiment_name}, timeout=30
    ).json()["experiment"]["experiment_id"]
    url = f"{ui}/#/experiments/{experiment}/evaluation-runs?selectedRunUuid={cand_id}&compareToRunUuid={base_id}"

    shown = page(url)
    text = shown.wait_for(comparison_shown, "the paired evaluation table")
    assert COMPARING.search(text), text[:3000]

    cand_traces = {case_id(t): t.info.trace_id for t in traces_of(uri, cand_id)}
    base_traces = {case_id(t): t.info.trace_id for t in traces_of(uri, base_id)}
    rows = ROW.findall(text)
    assert len(rows) >= 5, text[:3000]  # the table is virtualised: the rows on screen
    for case, first, second in rows:
        assert (first, second) == (cand_traces[case], base_traces[case]), case

    # The assessment column with the run's average and the delta against the baseline.
    cand_accuracy = cand.json()["summary"]["answer_accuracy"]
    delta = cand_accuracy - base.json()["summary"]["answer_accuracy"]
    header = AVG.search(text)
    assert header is not None, text[:3000]
    assert float(header.group(1)) == pytest.approx(cand_accuracy, abs=0.005)
    assert float(header.group(2)) == pytest.approx(delta, abs=0.005)
    assert REFUSED.search(text) is not None

    shot = tmp_path / "compare.png"
    shown.screenshot(shot)
    assert shot.stat().st_size > 50_000
    if os.environ.get("RAGEXP_UPDATE_SCREENSHOT") and logged_via == "store":
        shutil.copy(shot, Path(__file__).resolve().parents[1] / "docs/ui-compare-runs.png")


def click(shown: Page, text: str, selector: str = "button, [role=menuitem]") -> None:
    """A real mouse click (pressed and released) on the visible element reading exactly ``text``:
    the UI's menus open on pointer events, not on a script's ``click()``. The first such control
    that is enabled: the run list's ``Actions`` comes before the trace table's."""
    deadline = time.monotonic() + PAGE_WAIT_S
    while True:
        found = shown.call(
            "Runtime.evaluate",
            expression=(
                f"(() => {{ const els = [...document.querySelectorAll({json.dumps(selector)})]"
                ".filter(e => e.offsetParent !== null && !e.disabled"
                f" && (e.innerText || '').trim() === {json.dumps(text)});"
                " if (!els.length) return null; const r = els[0].getBoundingClientRect();"
                " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
            ),
            returnByValue=True,
        )["result"].get("value")
        if found:
            break
        assert time.monotonic() < deadline, f"the page never showed a {text!r} control"
        time.sleep(1)
    press(shown, found)


def press(shown: Page, point: list[float]) -> None:
    """A real mouse click (moved, pressed, released) at ``point``, the page's ``[x, y]``."""
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        shown.call("Input.dispatchMouseEvent", type=kind, x=point[0], y=point[1], button="left", clickCount=1)


def location(shown: Page) -> str:
    return str(shown.call("Runtime.evaluate", expression="location.href", returnByValue=True)["result"]["value"])


def tick_runs(shown: Page, names: list[str]) -> None:
    """Tick the checkbox of the run row named each of ``names``, in that order (other runs, such
    as the demo's attribution cells, stay unticked)."""
    shown.wait_for(lambda text: all(name in text for name in names), "the runs in the list")
    for name in names:
        ticked = shown.call(
            "Runtime.evaluate",
            expression=(
                # The run list is a grid whose cells need not share a row element: the row's
                # checkbox is the one level with the run's name.
                "(() => { const named = [...document.querySelectorAll('a, span, div, td')]"
                f".filter(e => e.offsetParent !== null && (e.textContent || '').trim() === {json.dumps(name)});"
                " const boxes = [...document.querySelectorAll('input[type=checkbox]')]"
                ".filter(b => b.offsetParent !== null);"
                " for (const e of named) { const r = e.getBoundingClientRect(); const y = r.y + r.height / 2;"
                " const box = boxes.find(b => { const q = b.getBoundingClientRect();"
                " return q.y <= y && y <= q.y + Math.max(q.height, 20) + 4 && q.x < r.x; });"
                " if (!box) continue; if (!box.checked) box.click(); return true; } return false; })()"
            ),
            returnByValue=True,
        )["result"].get("value")
        assert ticked, f"no checkbox in the row of {name}"
        time.sleep(0.5)


def test_the_demos_links_and_clicks_reach_the_comparisons_mlflow_has(
    ragexp: Any, store_uri: str, request: pytest.FixtureRequest, page: Callable[[str], Page], tmp_path: Path
) -> None:
    """What `ragexp demo` prints about the MLflow UI is what MLflow 3.17 has: its deep links open
    both comparisons, and the clicks it describes (tick the candidate and the baseline, then Compare)
    lead there, beside the runs of its attribution."""
    from ragexp.workflows.demo import BASELINE_NAME, CANDIDATE_NAME

    # The store the test's UI server serves, which `ragexp demo` makes itself in an empty folder.
    Path(store_uri.removeprefix("sqlite:///")).unlink()
    done = ragexp("demo", "--store", str(tmp_path / "mlruns"))
    assert done.code == 0, done.stderr
    ids = dict(
        line.split(" run: ")
        for line in done.stdout.splitlines()
        if line.startswith(("baseline run:", "candidate run:"))
    )
    links = re.findall(r"http://127\.0\.0\.1:5000(/#/\S+)", done.stdout)
    per_case = next(link for link in links if "/evaluation-runs?" in link)
    params = next(link for link in links if link.startswith("/#/compare-runs?"))
    ui = request.getfixturevalue("ui_server")
    comparing = "Comparing | #"
    both = re.compile(rf"Comparing \| #\w+ \| {re.escape(CANDIDATE_NAME)} \| to \| #\w+ \| {re.escape(BASELINE_NAME)}")

    # The clicks: Evaluation runs, tick the candidate (the upper, newer row), then the baseline,
    # Actions -> Compare: the same comparison (the run ticked first is shown against the other).
    experiment = per_case.split("/experiments/")[1].split("/")[0]
    shown = page(f"{ui}/#/experiments/{experiment}/evaluation-runs")
    tick_runs(shown, [CANDIDATE_NAME, BASELINE_NAME])
    click(shown, "Actions")
    click(shown, "Compare", "[role=menuitem]")
    text = shown.wait_for(lambda text: comparing in text and len(ROW.findall(text)) >= 5, "the comparison")
    assert both.search(text), text[:3000]
    url = location(shown)
    assert f"selectedRunUuid={ids['candidate']}" in url and f"compareToRunUuid={ids['baseline']}" in url
    assert "Compare to" not in text  # the control the docs once described is not there

    # The printed per-case link: the candidate compared to the baseline, one row per case.
    shown = page(ui + per_case)
    shown.wait_for(lambda text: both.search(text) is not None and len(ROW.findall(text)) >= 5, "the paired cases")

    # Params and metrics: the printed link, and Model training -> Runs -> tick both -> Compare.
    shown = page(ui + params)
    text = shown.wait_for(lambda t: "Comparing 2 Runs" in t and "provider.system.sample.chunking" in t, "run compare")
    assert CANDIDATE_NAME in text and BASELINE_NAME in text
    shown = page(f"{ui}/#/experiments/{experiment}/evaluation-runs")
    click(shown, "Model training", "button, label, span, div")
    tick_runs(shown, [CANDIDATE_NAME, BASELINE_NAME])
    click(shown, "Compare")
    shown.wait_for(lambda t: "Comparing 2 Runs" in t and "provider.system.sample.chunking" in t, "run compare")
    assert set(json.loads(location(shown).split("runs=")[1].split("&")[0].replace("%22", '"'))) == set(ids.values())


def test_a_conversations_turns_are_one_session_in_the_ui(
    ragexp: Any, store_uri: str, ui_server: str, page: Callable[[str], Page], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn is a trace in its conversation's session of its run: MLflow's session page of
    one conversation of one run lists the traces of its turns, in order, and no trace of another
    conversation or of the other run of the same conversations in the experiment."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    experiment_name = f"ui-chat-{time.time_ns()}"
    done = ragexp("run", "dataset=kb_zh_chat", f"experiment={experiment_name}", "--json")
    assert done.code == 0, done.stderr
    again = ragexp("run", "dataset=kb_zh_chat", f"experiment={experiment_name}", "--json")
    assert again.code == 0, again.stderr
    run_id = done.json()["run_id"]
    traces = traces_of(store_uri, run_id)
    by_case = {case_id(t): t for t in traces}
    turns = sorted((c for c in by_case if c.startswith("chat-shipping#")), key=lambda c: int(c.split("#")[1]))
    assert len(turns) >= 2
    experiment = httpx.get(
        ui_server + "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": experiment_name}, timeout=30
    ).json()["experiment"]["experiment_id"]
    shown = page(f"{ui_server}/#/experiments/{experiment}/chat-sessions/{quote(f'chat-shipping@{run_id}', safe='')}")
    others = sorted({c.split("#")[0] for c in by_case} - {"chat-shipping"})
    text = shown.wait_for(lambda text: all(f"case_id | {c} |" in text for c in turns), f"the turns {turns}")
    positions = [text.index(f"case_id | {c} |") for c in turns]
    assert positions == sorted(positions), "the turns in the order they were asked"
    # One run's turns: the other run's turns of the same conversation would be turns beyond these.
    assert f"Turn {len(turns)}" in text and f"Turn {len(turns) + 1}" not in text
    assert not any(f"case_id | {other}#" in text for other in others), "a turn of another conversation"


TOGGLE_ASSESSMENT = "[data-component-id='shared.model-trace-explorer.toggle-assessment-expanded']"
"""The chevron left of a feedback's value in the trace's Assessments pane: it shows the rationale."""


def feedback_card(shown: Page, name: str) -> tuple[list[float], str] | None:
    """The centre of the expand chevron of the feedback named ``name`` in the Assessments pane,
    and the text of that feedback's card; None while the pane does not show it."""
    found = shown.call(
        "Runtime.evaluate",
        expression=(
            "(() => { const pane = [...document.querySelectorAll('span')].find(e => e.offsetParent !== null"
            " && e.textContent.trim().startsWith('Feedback (')); if (!pane) return null;"
            " let card = [...document.querySelectorAll('span')].find(e => e.offsetParent !== null"
            f" && e.textContent.trim() === {json.dumps(name)}"
            " && (pane.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING));"
            f" while (card && !card.querySelector({json.dumps(TOGGLE_ASSESSMENT)})) card = card.parentElement;"
            f" if (!card) return null; const r = card.querySelector({json.dumps(TOGGLE_ASSESSMENT)})"
            ".getBoundingClientRect(); return [[r.x + r.width / 2, r.y + r.height / 2], card.innerText]; })()"
        ),
        returnByValue=True,
    )["result"].get("value")
    return None if found is None else (list(found[0]), str(found[1]))


def test_a_traces_assessments_show_the_rationale_the_run_wrote(
    ragexp: Any, store_uri: str, ui_server: str, page: Callable[[str], Page], tmp_path: Path
) -> None:
    """MLflow 3.17's trace drawer (the Traces tab, one trace selected): the "Assess" button opens
    the Assessments pane, and the chevron left of a feedback's value shows its "Rationale", the
    very text the run wrote for that case in cases.jsonl."""
    experiment_name = f"ui-reasons-{time.time_ns()}"
    done = ragexp("run", f"experiment={experiment_name}", "--json")  # kb_zh, the sample system, no judge
    assert done.code == 0, done.stderr
    run_id = done.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path / "cases")
    said = {case: row["rationale"]["recall_at_k"] for case, row in rows.items()}
    # A case that missed a relevant id, whose words no other case shares: the pane's text is its own.
    case = next(
        c for c, row in rows.items() if row["metrics"]["recall_at_k"] < 1 and list(said.values()).count(said[c]) == 1
    )
    rationale, score = said[case], rows[case]["metrics"]["recall_at_k"]
    trace_id = next(t.info.trace_id for t in traces_of(store_uri, run_id) if case_id(t) == case)
    experiment = httpx.get(
        ui_server + "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": experiment_name}, timeout=30
    ).json()["experiment"]["experiment_id"]

    shown = page(f"{ui_server}/#/experiments/{experiment}/traces?selectedEvaluationId={trace_id}")
    shown.wait_for(lambda text: f"case_id | {case} |" in text, f"the trace of {case}")
    assess = "button[aria-label^='Assess trace']"
    deadline = time.monotonic() + PAGE_WAIT_S
    while (point := centre_of(shown, assess)) is None:
        assert time.monotonic() < deadline, "the trace drawer never showed its Assess button"
        time.sleep(1)
    press(shown, point)
    deadline = time.monotonic() + PAGE_WAIT_S
    while (card := feedback_card(shown, "recall_at_k")) is None:
        shown_text = text_of(shown.dom())[:3000]
        assert time.monotonic() < deadline, f"the Assessments pane never showed recall_at_k: {shown_text}"
        time.sleep(1)
    chevron, before = card
    assert rationale not in text_of(shown.dom()), "the rationale showed before its feedback was expanded"
    assert before.split()[0] == "recall_at_k" and float(before.split()[1]) == pytest.approx(score), before

    press(shown, chevron)
    shown.wait_for(lambda text: rationale in text, f"the rationale of recall_at_k on {case}")
    expanded = feedback_card(shown, "recall_at_k")
    assert expanded is not None
    lines = [line.strip() for line in expanded[1].splitlines() if line.strip()]
    assert lines[lines.index("Rationale") + 1] == rationale, lines
    assert float(lines[lines.index("Feedback") + 1]) == pytest.approx(score), lines


def centre_of(shown: Page, selector: str) -> list[float] | None:
    """The centre of the first visible element matching ``selector``; None while there is none."""
    found = shown.call(
        "Runtime.evaluate",
        expression=(
            f"(() => {{ const e = [...document.querySelectorAll({json.dumps(selector)})]"
            ".find(e => e.offsetParent !== null); if (!e) return null; const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        ),
        returnByValue=True,
    )["result"].get("value")
    return None if found is None else list(found)


ASSESSMENT_AVG = re.compile(r"\| (\w+) \| AVG \| ([-\d.]+) \|(?: ([-+]\d[\d.]*) \|)?")
"""An assessment column's header on the comparison page: the candidate's average over its
run's assessments of that name, then the change from the baseline's when there is one."""
SHOWN_ASSESSMENTS = re.compile(r"\| Assessments \| \((\d+)/(\d+)\) \|")


def centre_of_text(shown: Page, selector: str, pattern: str) -> list[float] | None:
    """The centre of the last visible ``selector`` element whose text matches ``pattern`` (a
    JavaScript regular expression); None while there is none."""
    found = shown.call(
        "Runtime.evaluate",
        expression=(
            f"(() => {{ const re = new RegExp({json.dumps(pattern)});"
            f" const e = [...document.querySelectorAll({json.dumps(selector)})]"
            ".filter(e => e.offsetParent !== null && re.test((e.innerText || '').trim())).pop();"
            " if (!e) return null; const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        ),
        returnByValue=True,
    )["result"].get("value")
    return None if found is None else list(found)


def show_every_assessment(shown: Page) -> str:
    """The comparison page's text once every assessment column is on it. The table shows one
    at first; the column menu of the trace table (its button counts the columns shown, as
    "Columns 10/27") has an "All Assessments" option that shows or hides them all."""
    text = shown.wait_for(lambda t: SHOWN_ASSESSMENTS.search(t) is not None, "the evaluation table")
    deadline = time.monotonic() + PAGE_WAIT_S
    while (counted := SHOWN_ASSESSMENTS.search(text)) is None or counted.group(1) != counted.group(2):
        assert time.monotonic() < deadline, f"the page never showed every assessment: {text[:3000]}"
        option = centre_of_text(shown, "[role=option]", "^All Assessments$")
        if option is None:
            menu = centre_of_text(shown, "button", "^Columns\\s*\\d+/\\d+$")
            if menu is not None:
                press(shown, menu)
        else:
            press(shown, option)
        time.sleep(2)
        text = text_of(shown.dom())
    return text


def test_the_uis_average_of_each_assessment_is_the_runs_value(
    ragexp: Any,
    store_uri: str,
    ui_server: str,
    page: Callable[[str], Page],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default run (``kb_zh``: 35 cases, 5 of them unanswerable) compared with a run at
    ``k=1`` in MLflow's evaluation-runs page: the AVG each assessment column shows is the
    candidate's value in ``ragexp runs --json`` and its run summary, and the change beside it is
    the runs' difference. An unanswerable case carries no retrieval assessment, so the page
    averages recall, MRR and nDCG over the answerable cases, as every other surface does."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    experiment_name = f"ui-avg-{time.time_ns()}"
    base = ragexp("run", f"experiment={experiment_name}", "run_name=baseline", "k=1", "--json")
    cand = ragexp("run", f"experiment={experiment_name}", "run_name=candidate", "--json")
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    summary, base_summary = cand.json()["summary"], base.json()["summary"]
    listed = ragexp("runs", "--experiment", experiment_name, "--json")
    assert listed.code == 0, listed.stderr
    logged = next(r for r in listed.json()["runs"] if r["run_id"] == cand_id)["metrics"]
    assert {"recall_at_k", "mrr", "answer_accuracy"} <= set(logged)
    for name, value in logged.items():
        assert value == pytest.approx(summary[name]), name
    # The check tells the two populations apart: recall's mean over every case (what the page
    # showed while unanswerable traces carried retrieval assessments) is off by more than its rounding.
    rows = rows_of(store_uri, cand_id, tmp_path / "cases").values()
    every_case = sum(row["metrics"]["recall_at_k"] for row in rows) / len(rows)
    assert any(row["unanswerable"] for row in rows)
    assert abs(every_case - summary["recall_at_k"]) > 0.01

    experiment = httpx.get(
        ui_server + "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": experiment_name}, timeout=30
    ).json()["experiment"]["experiment_id"]
    runs = f"selectedRunUuid={cand_id}&compareToRunUuid={base_id}"
    shown = page(f"{ui_server}/#/experiments/{experiment}/evaluation-runs?{runs}")
    text = show_every_assessment(shown)
    assert COMPARING.search(text), text[:3000]
    averages = {name: (float(avg), change) for name, avg, change in ASSESSMENT_AVG.findall(text)}
    scored = {name for name in summary if METRICS[name].per_case}
    assert set(averages) == scored, text[:3000]
    for name, (avg, change) in averages.items():
        # The page rounds to two places; ``runs --json`` lists the headline metrics of them.
        assert avg == pytest.approx(logged.get(name, summary[name]), abs=0.005), name
        delta = summary[name] - base_summary[name]
        assert float(change or 0) == pytest.approx(delta, abs=0.0051), name
    assert averages["recall_at_k"][1], "k=1 lowers recall: the page shows a change"
