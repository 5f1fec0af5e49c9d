"""The leaderboard: a pure function of verified receipts, and its Markdown, JSON and chart.

Nothing here reads the clock, the machine or anything but the receipts handed in, so ``report``
rebuilds exactly what the run wrote.

How a trial is judged (``judge``):
- **recovered**: the last process verified a result equal to the expected one, every effect file
  is right, and no effect happened twice;
- **duplicated**: an effect that must happen once happened more than once (whatever else);
- **held**: the runtime stopped the run for an operator (durabl's dead letter), nothing doubled;
- **failed**: the runtime reports the run failed, or its restarts kept crashing;
- **stalled**: a process ran past its limit;
- **wrong**: the run ended but its result or its effects are not the expected ones.

Resumption latency is the time from spawning the first restarted process to its first new step
(a step whose body had not finished in the killed process), or to the end of the run when no step
was left. Duplicate token waste is the tokens of re-executed model calls over all tokens billed.
Per-step overhead is the time a runtime spends outside the step bodies of a clean run (from
ready to the first step, between steps, and after the last), per step, minus the plain loop's,
as medians of the calibration runs of the same bench run.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from durabl.bench.stats import median, percentile, wilson

SCHEMA = "durabl-bench-leaderboard/1"
OUTCOMES = ("recovered", "duplicated", "held", "failed", "stalled", "wrong")
WINDOWS = ("PROMPT", "EXEC", "WRITE", "VERIFY")


def judge(receipt: dict[str, Any]) -> str:
    observed = receipt["observed"]
    last = receipt["processes"][-1]
    if duplicates(observed) > 0:
        return "duplicated"
    verdict = observed.get("verdict") or {}
    result_ok = verdict.get("result") == receipt["workload"]["expected_result"]
    effects_ok = (
        observed["ledger_lines"] == 1
        and observed["outbox_lines"] == 1
        and all(observed["files_ok"].values())
    )
    if last["stalled"]:
        return "stalled"
    if last["exit"] == 0 and not last["killed"]:
        return "recovered" if result_ok and effects_ok and not observed["lock_left"] else "wrong"
    if last["exit"] == 3:
        return "held"
    return "failed"


def duplicates(observed: dict[str, Any]) -> int:
    return max(0, observed["ledger_lines"] - 1) + max(0, observed["outbox_lines"] - 1)


def token_counts(observed: dict[str, Any]) -> tuple[int, int]:
    """(re-executed tokens, all tokens billed) of one trial."""
    seen: set[str] = set()
    again = total = 0
    for step, tokens in observed["tokens"]:
        total += tokens
        if step in seen:
            again += tokens
        seen.add(step)
    return again, total


def resume_s(receipt: dict[str, Any]) -> float | None:
    processes = receipt["processes"]
    if len(processes) < 2 or not processes[0]["killed"]:
        return None
    finished = {e["name"] for e in processes[0]["events"] if e["event"] == "step_done"}
    for event in processes[1]["events"]:
        if event["event"] == "step" and event["name"] not in finished:
            return float(event["t"])
        if event["event"] == "run_end":
            return float(event["t"])
    return None


def steps_rerun(receipt: dict[str, Any]) -> int:
    names = [e["name"] for p in receipt["processes"] for e in p["events"] if e["event"] == "step"]
    return len(names) - len(set(names))


def _ready(receipt: dict[str, Any]) -> dict[str, Any] | None:
    for event in receipt["processes"][0]["events"]:
        if event["event"] == "ready":
            return event
    return None


def _runtime_s(receipt: dict[str, Any]) -> float | None:
    """The time a clean run spent outside its step bodies: from ``ready`` to the first step,
    between each step's end and the next one's start, and from the last step to ``run_end``.
    The step bodies (the same work for every runtime) are left out; what remains is what the
    runtime adds, its persistence above all."""
    process = receipt["processes"][0]
    if process["exit"] != 0 or process["killed"]:
        return None
    total = 0.0
    mark: float | None = None
    for event in process["events"]:
        if event["event"] == "ready" or event["event"] == "step_done":
            mark = event["t"]
        elif event["event"] in ("step", "run_end") and mark is not None:
            total += event["t"] - mark
            mark = None
            if event["event"] == "run_end":
                return total
    return None


def _ms(seconds: float | None, digits: int = 2) -> float | None:
    return None if seconds is None else round(seconds * 1000, digits)


def _cell(trials: list[dict[str, Any]]) -> dict[str, Any]:
    outcomes = Counter(judge(t) for t in trials)
    n = len(trials)
    recovered = outcomes["recovered"]
    low, high = wilson(recovered, n)
    again = sum(token_counts(t["observed"])[0] for t in trials)
    billed = sum(token_counts(t["observed"])[1] for t in trials)
    latencies = [s for s in (resume_s(t) for t in trials) if s is not None]
    stores = [t["store_check"] for t in trials if t.get("store_check") is not None]
    locks = [t for t in trials if t.get("lock_after_kill") is not None]
    tamper = [t["tamper_rejected"] for t in trials if "tamper_rejected" in t]
    return {
        "kills": n,
        "recovered": recovered,
        "recovery_rate": round(recovered / n, 4) if n else None,
        "recovery_ci95": [round(low, 4), round(high, 4)],
        **{outcome: outcomes[outcome] for outcome in OUTCOMES if outcome != "recovered"},
        "duplicate_effects": sum(duplicates(t["observed"]) for t in trials),
        "orphans": sum(len(t["orphans"]) for t in trials),
        "store_checks": len(stores),
        "store_broken": sum(1 for s in stores if not s["whole"]),
        "lock_checks": len(locks),
        "locks_left": sum(1 for t in locks if t["observed"]["lock_left"]),
        "tamper_checks": len(tamper),
        "tamper_rejected": sum(1 for x in tamper if x),
        "resume_ms_median": _ms(median(latencies), 1),
        "resume_ms_p95": _ms(percentile(latencies, 95), 1),
        "resume_samples": len(latencies),
        "tokens_reexecuted": again,
        "tokens_billed": billed,
        "token_waste": round(again / billed, 4) if billed else None,
        "steps_rerun_per_kill": round(sum(steps_rerun(t) for t in trials) / n, 2) if n else None,
    }


def build(receipts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The leaderboard of one bench run's verified receipts."""
    receipts = list(receipts)
    by_adapter: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for receipt in receipts:
        adapter = receipt["adapter"]
        entry = by_adapter.get(adapter["id"])
        if entry is None:
            entry = by_adapter[adapter["id"]] = {
                "adapter": adapter,
                "cal": [],
                "trials": [],
                "unavailable": None,
            }
            order.append(adapter["id"])
        if receipt["kind"] == "unavailable":
            entry["unavailable"] = receipt["reason"]
        elif receipt["kind"] == "calibration":
            entry["cal"].append(receipt)
        else:
            entry["trials"].append(receipt)
    step_count = len(receipts[0]["workload"]["steps"]) if receipts else 0
    plain_runs = [
        s
        for s in (_runtime_s(r) for r in by_adapter.get("plain", {}).get("cal", []))
        if s is not None
    ]
    plain_s = median(plain_runs)
    rows, not_measured = [], []
    for adapter_id in order:
        entry = by_adapter[adapter_id]
        adapter = entry["adapter"]
        runs = [s for s in (_runtime_s(r) for r in entry["cal"]) if s is not None]
        readies = [e for e in (_ready(r) for r in entry["cal"]) if e is not None]
        if entry["unavailable"] or not runs:
            reason = entry["unavailable"] or _clean_failure(entry["cal"])
            not_measured.append({"id": adapter_id, "label": adapter["label"], "reason": reason})
            continue
        if not entry["trials"] and adapter_id == "plain" and by_adapter.keys() - {"plain"}:
            continue  # calibrated only, as the baseline
        middle = median(runs)
        per_step = middle / step_count if middle is not None and step_count else None
        cell = _cell(entry["trials"])
        rows.append(
            {
                "id": adapter_id,
                "label": adapter["label"],
                "mechanism": adapter["mechanism"],
                "version": readies[0]["version"] if readies else None,
                **cell,
                "per_step_ms": _ms(per_step, 3),
                "overhead_ms": _ms(
                    None
                    if per_step is None or plain_s is None
                    else per_step - plain_s / step_count,
                    3,
                ),
                "import_ms": _ms(median([e["import_s"] for e in readies]), 1),
                "init_ms": _ms(median([e["init_s"] for e in readies]), 1),
                "clean_runs": len(runs),
                "windows": {
                    w: _cell([t for t in entry["trials"] if t["window"] == w])
                    for w in WINDOWS
                    if any(t["window"] == w for t in entry["trials"])
                },
            }
        )
    rows.sort(
        key=lambda r: (-r["recovery_ci95"][0], -(r["recovery_rate"] or 0), r["overhead_ms"] or 0)
    )
    first = receipts[0] if receipts else {}
    return {
        "schema": SCHEMA,
        "bench_run": first.get("bench_run"),
        "workload": first.get("workload", {}).get("name"),
        "kit_sha256": first.get("workload", {}).get("kit_sha256"),
        "environment": first.get("environment"),
        "seed": first.get("seed"),
        "receipts": len(receipts),
        "kills": sum(r["kills"] for r in rows),
        "plain_per_step_ms": _ms(None if plain_s is None else plain_s / step_count, 3),
        "rows": rows,
        "not_measured": not_measured,
    }


def _clean_failure(calibration: list[dict[str, Any]]) -> str:
    if not calibration:
        return "no clean run was made"
    last = calibration[-1]["processes"][-1]
    tail = (last.get("stderr_tail") or "").strip().splitlines()
    detail = tail[-1] if tail else f"exit code {last['exit']}"
    return f"a clean run did not complete: {detail}"[:300]


# -- rendering --------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, unit: str = "") -> str:
    return "–" if x is None else f"{x:g}{unit}"


def markdown(board: dict[str, Any]) -> str:
    env = board.get("environment") or {}
    lines = [
        "# Durability leaderboard",
        "",
        f"Bench run `{board['bench_run']}`: workload `{board['workload']}`, {board['kills']} kills "
        f"(SIGKILL) over {len(board['rows'])} runtimes, seed {board['seed']}, "
        f"{board['receipts']} verified receipts; Python {env.get('python')} on {env.get('system')}, "
        f"{env.get('cpus')} CPUs. Rebuilt from the receipts by `durabl bench report`.",
        "",
        *_overall(board["rows"]),
        "",
        "## Recovery by kill window",
        "",
        *_by_window(board["rows"]),
        "",
        "## Checks after the kill",
        "",
        *_checks(board["rows"]),
    ]
    if board["not_measured"]:
        lines += ["", "## Not measured", ""]
        lines += [f"- **{n['label']}** (`{n['id']}`): {n['reason']}" for n in board["not_measured"]]
    lines += [
        "",
        "Failed counts runs the runtime reported failed, runs whose restarts kept crashing and "
        "runs that ended with a wrong result. Per-step overhead is the time a runtime spends "
        "outside the step bodies of a clean run, per step, minus the plain loop's "
        f"{_num(board['plain_per_step_ms'], ' ms')}, medians of clean runs made in the same bench "
        "run. Absolute times vary between machines and days; compare runtimes within one table.",
        "",
    ]
    return "\n".join(lines)


def _overall(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Runtime | Version | Durability mechanism | Crash recovery (95% CI) | Held / stalled / failed "
        "| Duplicated effects | Orphans | Resume latency median / p95 | Duplicate token waste "
        "| Steps re-run per kill | Per-step overhead vs plain | Import + init |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["recovery_ci95"]
        lines.append(
            f"| {r['label']} | {r['version'] or '–'} | {r['mechanism']} "
            f"| {r['recovered']}/{r['kills']} = {_pct(r['recovery_rate'])} ({_pct(low)}–{_pct(high)}) "
            f"| {r['held']} / {r['stalled']} / {r['failed'] + r['wrong']} "
            f"| {r['duplicate_effects']} in {r['duplicated']} runs | {r['orphans']} "
            f"| {_num(r['resume_ms_median'], ' ms')} / {_num(r['resume_ms_p95'], ' ms')} "
            f"| {_pct(r['token_waste'])} | {_num(r['steps_rerun_per_kill'])} "
            f"| {_num(r['overhead_ms'], ' ms')} | {_num(r['import_ms'], ' ms')} + {_num(r['init_ms'], ' ms')} |"
        )
    return lines


def _by_window(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| Runtime | " + " | ".join(WINDOWS) + " |", "|---|" + "---|" * len(WINDOWS)]
    for r in rows:
        cells = []
        for w in WINDOWS:
            c = r["windows"].get(w)
            if c is None:
                cells.append("no arrivals")
                continue
            notes = [
                f"{k} {c[k]}" for k in ("duplicated", "held", "stalled", "failed", "wrong") if c[k]
            ]
            cells.append(
                f"{c['recovered']}/{c['kills']}" + (f" ({', '.join(notes)})" if notes else "")
            )
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines


def _checks(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| Runtime | Store whole after a WRITE kill | Verdict lock released after a VERIFY kill "
        "| Tampered receipt rejected |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['store_checks'] - r['store_broken']}/{r['store_checks']} "
            f"| {r['lock_checks'] - r['locks_left']}/{r['lock_checks']} "
            f"| {r['tamper_rejected']}/{r['tamper_checks']} |"
        )
    return lines


def write(board: dict[str, Any], out: Path) -> list[Path]:
    """Write leaderboard.md, leaderboard.json and (with matplotlib) leaderboard.png."""
    written = []
    md = out / "leaderboard.md"
    md.write_text(markdown(board))
    js = out / "leaderboard.json"
    js.write_text(json.dumps(board, indent=2, sort_keys=True) + "\n")
    written += [md, js]
    chart_path = chart(board, out / "leaderboard.png")
    if chart_path is not None:
        written.append(chart_path)
    return written


def chart(board: dict[str, Any], path: Path) -> Path | None:
    """Recovery rate (with its interval) against per-step overhead, one point per runtime.
    Needs matplotlib (``pip install 'durabl[bench]'``); without it, no chart and None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [
        r for r in board["rows"] if r["overhead_ms"] is not None and r["recovery_rate"] is not None
    ]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for r in rows:
        rate = 100 * r["recovery_rate"]
        low, high = (100 * x for x in r["recovery_ci95"])
        ax.errorbar(r["overhead_ms"], rate, yerr=[[rate - low], [high - rate]], fmt="o", capsize=4)
        ax.annotate(
            r["label"],
            (r["overhead_ms"], rate),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.set_xscale("symlog", linthresh=1.0)  # sub-millisecond and tens of milliseconds, one axis
    ax.set_xlabel("per-step overhead vs the plain loop (ms, log scale above 1 ms)")
    ax.set_ylabel("crash recovery rate (%), 95% Wilson interval")
    ax.set_ylim(-5, 105)
    ax.set_title(
        f"Durability under SIGKILL ({board['kills']} kills, bench run {board['bench_run']})"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path
