"""The dashboard in a real browser (the system's Chromium, driven by playwright), watching a real
agent process that is SIGKILLed inside a tool's ambiguous window and then restarted.

The page must show the dispatched card while the killed process is gone, then a boundary line
for each process and the completed run after the restart; it must load nothing from anywhere but
the local server, stay readable at phone width, be usable from the keyboard, and say "database
unavailable" while the file is gone rather than go blank. The server must never change the
database's bytes. It shows what a run's model answers spent (a model with no price as unknown,
never 0), what a crash made it spend again, the text a stream had got when it was cut off, and
the spend of a run with the runs it started.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from durabl import (
    ChildRun,
    ContinueAsNew,
    ModelCall,
    Parallel,
    RetryPolicy,
    Runtime,
    ToolCall,
    WaitSignal,
    ledger,
    llm,
    metrics,
    tool,
    workflow,
)
from durabl.crashpoints import ProcessDeath
from durabl.store import open_store

AGENT = Path(__file__).with_name("sigkill_agent.py")
RUN_ID = "courier-1"
WAIT_MS = 15_000


def agent(folder: Path, *crash: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AGENT), str(folder / "agent.db"), str(folder / "outbox"),
         str(folder / "calls"), *crash],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Dashboard:
    def __init__(self, db: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durabl", "--db", str(db), "ui", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, (line, self.proc.stderr.read() if self.proc.stderr else "")
        self.url = found.group(0)

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=10)
        return self.proc.returncode


@pytest.fixture
def killed(tmp_path: Path) -> Path:
    """A run whose process was SIGKILLed inside its second publish (step 4), after the dispatch.

    That publish holds an explicit idempotency key, so its opening is committed before the call
    and the log shows it in flight. (The first publish, step 2, has a derived key: its opening
    is committed with its outcome, and a kill inside it leaves nothing to show.)"""
    done = agent(tmp_path, "--crash-at", "after_tool_dispatched", "--occurrence", "2")
    assert done.returncode == -signal.SIGKILL, done.stderr
    return tmp_path


@pytest.fixture
def browser_page() -> Iterator[tuple[Page, list[str]]]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        try:
            yield page, requests
        finally:
            browser.close()


def test_a_run_killed_and_resumed_under_the_page(killed: Path, browser_page) -> None:
    page, requests = browser_page
    db = killed / "agent.db"
    dashboard = Dashboard(db)
    try:
        page.goto(dashboard.url)
        # the run list, reached from the keyboard
        link = page.get_by_role("link", name=RUN_ID)
        link.focus()
        page.keyboard.press("Enter")
        page.wait_for_selector("#step-4", timeout=WAIT_MS)
        assert page.get_attribute("#step-4", "data-state") == "dispatched: ambiguous window"
        assert "died inside the tool" in page.inner_text("#step-4")
        for done in ("#step-1", "#step-2", "#step-3"):
            assert page.get_attribute(done, "data-state") == "done in this process"
        assert page.locator("#step-5").count() == 0
        page.screenshot(path=str(killed / "killed.png"), full_page=True)

        # restarted in a new process while the page watches
        restarted = agent(killed)
        assert json.loads(restarted.stdout)["status"] == "COMPLETED", restarted.stderr
        page.wait_for_selector("#run-status:has-text('COMPLETED')", timeout=WAIT_MS)
        boundaries = page.locator(".boundary").all_inner_texts()
        assert len(boundaries) == 2
        assert boundaries[0].startswith("process 1 started the run")
        assert boundaries[1].startswith("process 2 took over")
        states = [c.get_attribute("data-state") for c in page.locator(".card").all()]
        assert states == [*["done, from the log"] * 3, *["done in this process"] * 2]
        # the step the killed process had dispatched runs again below the new boundary
        order = page.eval_on_selector_all("#steps > li", "items => items.map(i => i.id || 'b')")
        assert order == ["b", "step-1", "step-2", "step-3", "b", "step-4", "step-5"]
        metrics = dict(zip(page.locator("#metrics dt").all_inner_texts(),
                           page.locator("#metrics dd").all_inner_texts(), strict=True))  # fmt: skip
        assert metrics["processes"] == "2" and metrics["re-executed calls"] == "1"
        page.screenshot(path=str(killed / "dashboard.png"), full_page=True)
        assert (killed / "dashboard.png").stat().st_size > 10_000

        # readable on a phone: nothing wider than the window
        page.set_viewport_size({"width": 390, "height": 800})
        assert page.evaluate("document.documentElement.scrollWidth") <= 390

        # the file gone for a moment: the page says so and keeps what it drew
        moved = db.rename(killed / "elsewhere.db")
        page.wait_for_selector("#health:has-text('database unavailable')", timeout=WAIT_MS)
        assert page.locator(".card").count() == 5
        moved.rename(db)
        page.wait_for_selector("#health:text-is('')", state="attached", timeout=WAIT_MS)
    finally:
        assert dashboard.stop() == 0
    assert requests and all(url.startswith(dashboard.url) for url in requests), requests


def test_the_server_never_writes(killed: Path) -> None:
    db = killed / "agent.db"
    before = digest(db)
    dashboard = Dashboard(db)
    try:
        status, runs = dashboard.get("/api/runs?limit=1")
        assert status == 200 and runs["runs"][0]["run_id"] == RUN_ID
        status, run = dashboard.get(f"/api/runs/{RUN_ID}?after=0")
        assert status == 200 and run["events"][0]["kind"] == "RUN_STARTED"
        last = run["events"][-1]["seq"]
        status, again = dashboard.get(f"/api/runs/{RUN_ID}?after={last}")
        assert status == 200 and again["events"] == []  # only what comes after
    finally:
        assert dashboard.stop() == 0
    assert digest(db) == before


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/runs/nope", 404, "no run 'nope'"),
        ("/api/runs?limit=abc", 400, "limit must be a whole number"),
        ("/api/runs?limit=0", 400, "limit must be between 1 and 200"),
        ("/api/runs?status=LOST", 400, "unknown status 'LOST'"),
        (f"/api/runs/{RUN_ID}?after=-1", 400, "after must be a whole number"),
        ("/nothing", 404, "nothing at /nothing"),
    ],
)
def test_bad_requests_get_one_clear_message(
    killed: Path, path: str, status: int, says: str
) -> None:
    dashboard = Dashboard(killed / "agent.db")
    try:
        got, body = dashboard.get(path)
    finally:
        dashboard.stop()
    assert got == status and says in body["error"]


def test_an_unknown_run_in_the_url_is_said_on_the_page(killed: Path, browser_page) -> None:
    page, _ = browser_page
    dashboard = Dashboard(killed / "agent.db")
    try:
        page.goto(dashboard.url + "#run=nope")
        page.wait_for_selector("#run-title:text-is('No such run')", timeout=WAIT_MS)
        assert "no run 'nope'" in page.inner_text("#run-status")
    finally:
        dashboard.stop()


def run_ui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durabl", *args], capture_output=True, text=True, timeout=30
    )


def test_bad_databases_and_ports(tmp_path: Path, killed: Path) -> None:
    missing = run_ui("--db", str(tmp_path / "none.db"), "ui", "--port", "0")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    not_ours = tmp_path / "notes.txt"
    not_ours.write_text("hello\n")
    refused = run_ui("--db", str(not_ours), "ui", "--port", "0")
    assert refused.returncode == 2 and refused.stderr.startswith("durabl: ")
    assert not_ours.read_text() == "hello\n"
    bad_port = run_ui("--db", str(killed / "agent.db"), "ui", "--port", "70000")
    assert bad_port.returncode == 2 and "0 to 65535" in bad_port.stderr
    first = Dashboard(killed / "agent.db")
    try:
        port = first.url.rsplit(":", 1)[1].strip("/")
        taken = run_ui("--db", str(killed / "agent.db"), "ui", "--port", port)
        assert taken.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in taken.stderr
    finally:
        first.stop()
    for done in (missing, refused, bad_port, taken):
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_non_loopback_bind_warns(killed: Path) -> None:
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "durabl", "--db", str(killed / "agent.db"), "ui",
         "--host", "0.0.0.0", "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert dashboard.stdout is not None
        assert dashboard.stdout.readline().startswith("warning: serving on 0.0.0.0, not loopback")
    finally:
        dashboard.send_signal(signal.SIGTERM)
        dashboard.communicate(timeout=10)


HERE = Path(__file__).resolve().parent


def prepare_states(db: Path) -> None:
    """A run in each state a card can show, from ``cli_agents`` (in a process of its own) and
    one run waiting to retry a failed tool in an hour."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1] / "src")])}
    pairs = [
        "sleeping:sleeping",
        "dead_lettered:dead",
        "held:held",
        "failed:failed",
        "costly:costly",
    ]
    subprocess.run(
        [sys.executable, str(HERE / "cli_agents.py"), str(db), *pairs], env=env, check=True,
        timeout=60,
    )  # fmt: skip

    def flaky(n: int) -> dict:
        raise ConnectionError("the search service is down")

    @workflow(name="retrying")
    def retrying(ctx: Any) -> Any:
        return (yield ToolCall("flaky", {"n": 1}))

    @workflow(name="approving")
    def approving(ctx: Any) -> Any:
        return (yield WaitSignal("approve", timeout=3600))

    policy = RetryPolicy(max_attempts=3, base_delay=3600)
    with Runtime(db, tools={"flaky": tool(flaky, mode="IDEMPOTENT", retry=policy)}) as rt:
        assert rt.run(retrying, {}, run_id="retrying").status == "SLEEPING"
        assert rt.run(approving, {}, run_id="waiting").status == "WAITING"


def test_every_card_state_is_drawn(tmp_path: Path, browser_page) -> None:
    page, _ = browser_page
    db = tmp_path / "states.db"
    prepare_states(db)
    dashboard = Dashboard(db)
    try:

        def cards(run_id: str) -> list[tuple[str | None, str]]:
            page.goto(f"{dashboard.url}#run={run_id}")
            page.wait_for_selector(f"#run-title:text-is('Run {run_id}')")
            page.wait_for_selector("#steps .card")
            page.wait_for_timeout(700)  # one more poll: the page has all there is
            return [
                (c.get_attribute("data-state"), c.inner_text()) for c in page.locator(".card").all()
            ]

        state, text = cards("sleeping")[-1]
        assert state == "sleeping" and "timer due at" in text
        assert page.locator("#timers-pane").is_visible()
        assert "due at" in page.inner_text("#timers")

        state, text = cards("dead")[-1]
        assert state == "dead-lettered"
        assert "durabl dlq redrive dead" in text and "durabl dlq resolve dead" in text
        assert "durabl dlq cancel dead" in text

        state, text = cards("held")[-1]
        assert state == "held" and "NonDeterminismError" in text and "was recorded as" in text

        state, _ = cards("failed")[-1]
        assert state == "failed"

        state, text = cards("waiting")[-1]
        assert state == "waiting for a signal" and "times out at" in text
        assert 'WAITING for signal "approve" since' in page.inner_text("#run-status")

        state, text = cards("retrying")[-1]
        assert (
            state == "retrying" and "next attempt at" in text and "search service is down" in text
        )

        cards("costly")
        metrics = dict(zip(page.locator("#metrics dt").all_inner_texts(),
                           page.locator("#metrics dd").all_inner_texts(), strict=True))  # fmt: skip
        assert int(metrics["tokens"]) > 0

        # the run list: filtered by status, and read in light and dark
        page.goto(dashboard.url)
        page.select_option("#status", "DEAD_LETTERED")
        expect(page.locator("#runs tbody tr")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#runs tbody tr")).to_contain_text("DEAD_LETTERED")
        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.emulate_media(color_scheme="dark")
        dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert light != dark
        page.emulate_media(color_scheme="light")
        page.select_option("#status", "WAITING")
        expect(page.locator("#runs tbody tr")).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#runs tbody tr")).to_contain_text('WAITING for signal "approve" since')
    finally:
        dashboard.stop()


def echo(x: Any) -> Any:
    return x


@workflow(name="ui.kid")
def kid(ctx: Any, n: int) -> Any:
    return (yield ToolCall("echo", {"x": n}))


@workflow(name="ui.waiting_kid")
def waiting_kid(ctx: Any) -> Any:
    return (yield WaitSignal("go"))


@workflow(name="ui.parent")
def parent(ctx: Any) -> Any:
    return [(yield ChildRun(kid, {"n": 1})), (yield ChildRun(waiting_kid))]


@workflow(name="ui.looping")
def looping(ctx: Any, turn: int) -> Any:
    if turn < 1:
        yield ContinueAsNew({"turn": turn + 1})
    return (yield ToolCall("echo", {"x": turn}))


@workflow(name="ui.fanning")
def fanning(ctx: Any) -> Any:
    return (yield Parallel([ToolCall("echo", {"x": "a"}), ToolCall("echo", {"x": "b"})]))


def linked_runtime(db: Path) -> Runtime:
    return Runtime(db, tools={"echo": tool(echo, mode="IDEMPOTENT")})


def test_linked_runs_are_links_and_continued_runs_have_a_style(
    tmp_path: Path, browser_page
) -> None:
    page, requests = browser_page
    db = tmp_path / "links.db"
    with linked_runtime(db) as rt:
        assert rt.run(parent, run_id="parent").status == "WAITING"  # on its child parent-2
        assert rt.run(looping, {"turn": 0}, run_id="loop").status == "COMPLETED"
        loop = rt.store.get_run("loop")
        assert loop is not None and loop.result_text is not None
        after = json.loads(loop.result_text)["continued_as"]
        assert rt.run(fanning, run_id="fan").status == "COMPLETED"
    before = digest(db)
    dashboard = Dashboard(db)
    links, title = page.locator("#links li"), page.locator("#run-title")
    try:
        page.goto(f"{dashboard.url}#run=parent")
        expect(links).to_have_text(
            ["child run parent-1 (step 1): COMPLETED", "child run parent-2 (step 2): WAITING"],
            timeout=WAIT_MS,
        )
        expect(page.locator("#run-status")).to_contain_text("WAITING for child run parent-2 since")
        expect(page.locator("#step-2")).to_have_attribute("data-state", "waiting for its child run")
        expect(page.locator("#step-2")).to_contain_text("child run parent-2: WAITING")

        # the child's page, reached through its link, links back to its parent
        page.locator("#links").get_by_role("link", name="parent-2", exact=True).click()
        expect(title).to_have_text("Run parent-2")
        expect(links).to_have_text(["parent run parent, step 2"])
        expect(page.locator("#run-status")).to_contain_text('WAITING for signal "go" since')
        page.locator("#links").get_by_role("link", name="parent", exact=True).click()
        expect(title).to_have_text("Run parent")
        # a child card links to its child too
        page.locator("#step-1").get_by_role("link", name="parent-1", exact=True).click()
        expect(title).to_have_text("Run parent-1")
        expect(links).to_have_text(["parent run parent, step 1"])

        # each end of a ContinueAsNew links to the other
        page.goto(f"{dashboard.url}#run=loop")
        expect(links).to_have_text([f"continued as run {after}"], timeout=WAIT_MS)
        page.locator("#links").get_by_role("link", name=after).click()
        expect(title).to_have_text(f"Run {after}")
        expect(links).to_have_text(["continued from run loop"])
        page.locator("#links").get_by_role("link", name="loop").click()
        expect(title).to_have_text("Run loop")

        # a Parallel's branches are drawn as its own, and a run with no links shows none
        page.goto(f"{dashboard.url}#run=fan")
        expect(page.locator("#step-3")).to_contain_text("3. branch 2 of 2 (step 1): tool echo")
        assert page.locator("#steps .card.branch").count() == 2
        assert "branch" not in (page.get_attribute("#step-1", "class") or "")
        expect(page.locator("#links")).to_be_hidden()

        # the run list: CONTINUED in a style of its own, and what the parent waits for
        page.goto(dashboard.url)
        continued = page.locator("#runs .status.st-continued")
        expect(continued).to_have_text(["CONTINUED"], timeout=WAIT_MS)
        style = "e => getComputedStyle(e).color + ' ' + getComputedStyle(e).fontStyle"
        looks = {
            status: page.locator(f"#runs .status.st-{status}").first.evaluate(style)
            for status in ("continued", "completed", "waiting")
        }
        assert len(set(looks.values())) == 3, looks
        expect(page.locator("#runs tbody tr", has_text="parent-2").first).to_be_visible()
        row = page.locator("#runs tbody tr").filter(
            has=page.get_by_role("link", name="parent", exact=True)
        )
        expect(row).to_contain_text("WAITING for child run parent-2 since")
        assert digest(db) == before  # the server read all of that and wrote nothing

        # the child answered while the page watches the parent: both ends are drawn anew
        page.goto(f"{dashboard.url}#run=parent")
        expect(links).to_have_count(2, timeout=WAIT_MS)
        with linked_runtime(db) as rt:
            rt.signal("parent-2", "go", "yes")
            rt.tick()
            rt.tick()
            assert rt.state("parent").status == "COMPLETED"
        expect(page.locator("#run-status")).to_contain_text("COMPLETED", timeout=WAIT_MS)
        expect(links).to_have_text(
            ["child run parent-1 (step 1): COMPLETED", "child run parent-2 (step 2): COMPLETED"]
        )
        # (its end came from the child, before the parent's next process took it over)
        expect(page.locator("#step-2")).to_have_attribute("data-state", "done, from the log")
        expect(page.locator("#step-2")).to_contain_text("child run parent-2: COMPLETED")
    finally:
        assert dashboard.stop() == 0
    assert requests and all(url.startswith(dashboard.url) for url in requests), requests


USAGE = {"input_tokens": 1000, "output_tokens": 500, "cached_tokens": 200, "total_tokens": 1500}
ANSWER_USD = (800 * 0.15 + 200 * 0.075 + 500 * 0.60) / 1e6  # gpt-4o-mini's list price


def answer(prompt: Any, **params: Any) -> dict[str, Any]:
    """The model: answers with its name and its usage."""
    return {"text": f"answer to {prompt}", "model": params.get("model", "gpt-4o-mini"),
            "usage": dict(USAGE)}  # fmt: skip


def dies_mid_stream(prompt: Any, **params: Any) -> dict[str, Any]:
    """The model, whose process dies while it streams an answer, after 12 characters."""
    if not params.get("stream"):
        return answer(prompt, **params)
    answering = llm.current()
    assert answering is not None
    for piece in ("The ", "plan ", "is "):
        answering.chunk(piece)
    answering.flush()
    raise ProcessDeath("mid-stream")


@workflow(name="ui.checker")
def checker(ctx: Any) -> Any:
    return (yield ModelCall("check the plan"))["text"]


@workflow(name="ui.spender")
def spender(ctx: Any) -> Any:
    plan = yield ModelCall("plan")
    draft = yield ModelCall("draft", stream=True)
    house = yield ModelCall("house", model="house-model-7")  # a model with no price
    checked = yield ChildRun(checker)
    return [plan["text"], draft["text"], house["text"], checked]


def figures(page: Page) -> dict[str, str]:
    return dict(zip(page.locator("#metrics dt").all_inner_texts(),
                    page.locator("#metrics dd").all_inner_texts(), strict=True))  # fmt: skip


def test_what_a_run_spent_and_spent_again_after_a_stream_was_cut_off(
    tmp_path: Path, browser_page: tuple[Page, list[str]]
) -> None:
    page, requests = browser_page
    db = tmp_path / "spend.db"
    # A short lease, so that once the process is "dead" (the death is simulated in this one)
    # its lease runs out and no one drives the run, as after a real crash.
    with Runtime(db, llm=dies_mid_stream, lease_s=1.0) as rt, pytest.raises(ProcessDeath):
        rt.run(spender, run_id="spender")
    with closing(open_store(str(db), read_only=True)) as store:
        row = store.get_run("spender")
        assert row is not None and row.lease is not None
        time.sleep(max(0.0, row.lease.expires_s - time.time()) + 0.1)

    dashboard = Dashboard(db)
    cut = page.locator("#step-2 .partial")
    try:
        page.goto(f"{dashboard.url}#run=spender")
        expect(cut).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#step-2")).to_have_attribute("data-state", "pending")
        expect(cut).to_have_attribute("data-attempt", "1")
        expect(cut).to_have_attribute("data-cut", "true")
        expect(cut.locator("p")).to_have_text(
            "cut off mid-stream, attempt 1 (12 characters): its process is gone; the next "
            "process to resume the run makes the call again"
        )
        assert cut.locator("blockquote").text_content() == "The plan is "
        expect(page.locator("#step-1 .spend")).to_have_text(
            f"1500 tokens (1000 in, 500 out, 200 cached) · ${ANSWER_USD:.6f}"
        )

        # a new process asks again while the page watches
        with Runtime(db, llm=answer, workflows=[spender, checker]) as rt:
            assert rt.resume("spender").status == "COMPLETED"
        expect(page.locator("#run-status")).to_contain_text("COMPLETED", timeout=WAIT_MS)
        expect(page.locator("#step-2")).to_have_attribute("data-state", "done in this process")
        expect(cut).to_have_attribute("data-cut", "true")
        expect(cut.locator("p")).to_have_text(
            "cut off mid-stream, attempt 1 (12 characters): its process died; the call was "
            "made again"
        )
        expect(page.locator("#step-2 .spend")).to_have_text(
            f"1500 tokens (1000 in, 500 out, 200 cached) · ${ANSWER_USD:.6f}"
        )
        expect(page.locator("#step-2")).to_contain_text("answer to draft")
        expect(page.locator("#step-3 .spend")).to_have_text(
            "1500 tokens (1000 in, 500 out, 200 cached) · cost unknown: no price for house-model-7"
        )
        assert page.locator("#step-1 .partial, #step-3 .partial").count() == 0
        with closing(open_store(str(db), read_only=True)) as store:
            tree = ledger.spend(store, "spender")
            folded = metrics.of_run(store, "spender")
        assert (tree.runs, tree.tokens, tree.unpriced_calls) == (2, 6000, 1)
        unknown = "unknown for 1 answer of a model with no price"
        expect(page.locator("#metrics")).to_contain_text("with the runs it started")
        shown = figures(page)
        assert shown["tokens"] == "4500"
        assert shown["cost"] == f"${2 * ANSWER_USD:.6f} + {unknown}"  # not $0 for the third
        assert shown["re-executed spend (estimated)"] == (
            f"${ANSWER_USD:.6f} · 1500 tokens (1 model call made again)"
        )
        assert shown["cut-off streamed text"] == "12 characters"
        assert shown["with the runs it started"] == (
            f"${tree.cost_usd:.6f} + {unknown} · 6000 tokens · 2 runs"
        )
        # what the server folded poll by poll is what the whole log folds to
        status, body = dashboard.get("/api/runs/spender?after=0")
        assert status == 200 and body["metrics"] == folded.as_dict()
        assert body["with_runs_started"] == {
            "tokens": tree.tokens, "cost_usd": tree.cost_usd, "unpriced_calls": 1, "runs": 2,
            "complete": True,
        }  # fmt: skip

        # the child started no run: its own spend only
        page.locator("#links").get_by_role("link", name="spender-4").click()
        expect(page.locator("#run-title")).to_have_text("Run spender-4")
        expect(page.locator("#step-1 .spend")).to_have_count(1, timeout=WAIT_MS)
        shown = figures(page)
        assert shown["cost"] == f"${ANSWER_USD:.6f}"
        assert shown["re-executed spend (estimated)"] == "none"
        assert "with the runs it started" not in shown
        page.screenshot(path=str(tmp_path / "spend.png"), full_page=True)
    finally:
        assert dashboard.stop() == 0
    assert requests and all(url.startswith(dashboard.url) for url in requests), requests

    # compacted: the figures of the folded prefix come from the snapshot, for a fresh server too
    with Runtime(db) as rt:
        assert "spender" in {c.run_id for c in rt.compact().runs}
    again = Dashboard(db)
    try:
        status, body = again.get("/api/runs/spender?after=0")
    finally:
        assert again.stop() == 0
    assert status == 200 and body["compacted"] > 0
    assert body["metrics"] == folded.as_dict()
