"""Render README.md from ``docs/README.template.md`` and ``docs/numbers.json``.

    python scripts/build_readme.py          # write README.md
    python scripts/build_readme.py --check  # exit 1 if README.md is not what it would write

The template holds ``{{ path.to.figure }}`` for single figures (looked up in numbers.json) and
``{{ table:NAME }}`` for the generated tables. No figure in the README is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "docs" / "README.template.md"
NUMBERS = REPO / "docs" / "numbers.json"
README = REPO / "README.md"
PLACEHOLDER = re.compile(r"\{\{\s*([\w.:]+)\s*\}\}")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:,.0f} ms" if x >= 100 else f"{x:.2f} ms")


def leaderboard_table(numbers: dict[str, Any]) -> str:
    lines = [
        "| Runtime | Crash recovery (95% CI) | Duplicated effects | Held for an operator "
        "| Orphans | Resume latency (median) | Duplicate token waste | Per-step overhead vs plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in numbers["leaderboard"]["rows"]:
        low, high = r["recovery_ci95"]
        lines.append(
            f"| {r['label']} {r['version'] or ''} "
            f"| {r['recovered']}/{r['kills']} = {_pct(r['recovery_rate'])} ({_pct(low)}–{_pct(high)}) "
            f"| {r['duplicate_effects']} | {r['held']} | {r['orphans']} "
            f"| {_ms(r['resume_ms_median'])} | {_pct(r['token_waste'])} | {_ms(r['overhead_ms'])} |"
        )
    return "\n".join(lines)


def negative_control_table(numbers: dict[str, Any]) -> str:
    lines = ["| Broken runtime | Its bug | Caught |", "|---|---|---|"]
    for row in numbers["negative_control"]["rows"]:
        lines.append(
            f"| {row['variant']} | {row['bug']} | {row['flagged']} of {row['scenarios']} |"
        )
    return "\n".join(lines)


SCALE_TARGETS = {
    "scale_ratio_process": "per-step cost, 1,000,000 events over an empty database, process",
    "scale_ratio_full": "per-step cost, 1,000,000 events over an empty database, full",
    "cli_runs_in_process_ms_median": "`durabl runs` on 10,000 runs, inside its process, ms",
    "dashboard_list_in_process_ms_median": "dashboard run list on 10,000 runs, handler, ms",
    "dashboard_poll_in_process_ms_median": "dashboard poll of a run, handler, ms",
    "dashboard_list_http_ms_median": "dashboard run list over HTTP, ms",
    "dashboard_poll_http_ms_median": "dashboard poll of a run over HTTP, ms",
    "worker_parked_hwm_mb": "a worker holding 1,000 parked runs, peak RSS, MB",
    "worker_parking_hwm_mb": "a worker parking 1,000 runs itself, peak RSS, MB",
    "resume_peak_above_baseline_mb": "resuming a 10,000-step run, MB above the baseline",
}
"""How the README names each target of ``bench/results/scale.json``."""


def _met(met: bool) -> str:
    return "met" if met else "**missed**"


def performance_table(numbers: dict[str, Any]) -> str:
    lines = ["| Target | Measured | Limit | |", "|---|---|---|---|"]
    for t in numbers["compare"]["targets"]:
        lines.append(f"| {t['target']} | {t['value']:g} | {t['limit']:g} | {_met(t['met'])} |")
    for key, t in numbers["scale"]["targets"].items():
        lines.append(
            f"| {SCALE_TARGETS[key]} | {t['measured']:g} | {t['target']:g} | {_met(t['met'])} |"
        )
    for c in numbers["throughput"]["target"]["cells"]:
        lines.append(
            f"| full-mode steps/s, {c['concurrency']} concurrent runs ({c['variant']}) / one "
            f"fsync per step | {c['ratio_to_cap']:.3f} | > 1 | {_met(c['met'])} |"
        )
    return "\n".join(lines)


THROUGHPUT_ROWS = (
    ("durabl", "full", "durabl, full"),
    ("durabl", "process", "durabl, process"),
    ("dbos", "default", "DBOS"),
    ("langgraph", "default", "LangGraph"),
)


def throughput_table(numbers: dict[str, Any]) -> str:
    cells = [c for c in numbers["throughput"]["cells"] if c["kind"] == "threads"]
    counts = sorted({c["concurrency"] for c in cells})
    lines = [
        "| Tool calls | Runtime | "
        + " | ".join(f"{n} at once" for n in counts)
        + f" | Commits per fsync, {counts[-1]} at once |",
        "|---|---|" + "---|" * (len(counts) + 1),
    ]
    for variant in dict.fromkeys(c["variant"] for c in cells):
        for runtime, mode, label in THROUGHPUT_ROWS:
            row = {
                c["concurrency"]: c
                for c in cells
                if (c["variant"], c["runtime"], c["mode"]) == (variant, runtime, mode)
            }
            if not row:
                continue
            shared = row[counts[-1]]["commits_per_transaction_median"] if mode == "full" else None
            lines.append(
                f"| {'instant' if variant == 'instant' else 'wait 2 ms'} | {label} | "
                + " | ".join(f"{row[n]['steps_per_s_median']:,.0f}" for n in counts)
                + f" | {'–' if shared is None else f'{shared:.1f}'} |"
            )
    return "\n".join(lines)


def _latency(x: float) -> str:
    return f"{x * 1e3:,.0f} ms" if x < 1 else f"{x:.1f} s"


def _takeover_row(case: dict[str, Any]) -> str:
    if case["death"] == "SIGSTOP":
        where = f"a hung worker (SIGSTOP) on another host, lease {case['lease_s']:g} s"
    else:
        where = f"a SIGKILLed worker on {'another' if case['other_host'] else 'the same'} host"
    return f"takeover of {where}, poll {case['poll_s']:g} s"


def postgres_table(numbers: dict[str, Any]) -> str:
    pg = numbers["postgres"]
    lines = [
        "| Median | durabl on PostgreSQL | durabl on SQLite | DBOS on PostgreSQL "
        "| One raw INSERT, PostgreSQL |",
        "|---|---|---|---|---|",
    ]
    for n, rate in pg["workers"]["postgres"].items():
        lite = pg["workers"].get("sqlite", {}).get(n)
        lines.append(
            f"| steps/s, {n} worker process{'es' if n != '1' else ''} | {rate:,.0f} "
            f"| {'–' if lite is None else f'{lite:,.0f}'} | – | – |"
        )
    rows: dict[str, dict[str, str]] = {}
    for case in pg["takeover"]:
        rows.setdefault(_takeover_row(case), {})[case["backend"]] = _latency(case["latency_s"])
    for label, by in rows.items():
        lines.append(f"| {label} | {by.get('postgres', '–')} | {by.get('sqlite', '–')} | – | – |")
    over = pg["overhead_us"]
    for column in ("full", "process"):
        side = {(c["runtime"], c["backend"]): c for c in over.values() if c["column"] == column}

        def us(runtime: str, backend: str, side: dict[Any, Any] = side) -> str:
            c = side.get((runtime, backend))
            return "–" if c is None else f"{c['median']:,g} µs"

        dbos = us("dbos", "postgres")
        if column == "process" and dbos != "–":
            dbos += " (synchronous_commit off)"
        mode = f'`"{column}"`'
        lines.append(
            f"| per-step overhead, {mode} | {us('durabl', 'postgres')} "
            f"| {us('durabl', 'sqlite')} | {dbos} | {pg['floor_us'][column]:,g} µs "
            f"(synchronous_commit {'on' if column == 'full' else 'off'}) |"
        )
    return "\n".join(lines)


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "leaderboard": leaderboard_table,
    "negative_control": negative_control_table,
    "performance": performance_table,
    "throughput": throughput_table,
    "postgres": postgres_table,
}


def _figure(numbers: dict[str, Any], path: str) -> str:
    value: Any = numbers
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"docs/numbers.json has no {path!r}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def render(template: str, numbers: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("table:"):
            return TABLES[name.removeprefix("table:")](numbers)
        return _figure(numbers, name)

    return PLACEHOLDER.sub(one, template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render(TEMPLATE.read_text(), json.loads(NUMBERS.read_text()))
    if args.check:
        if README.read_text() != text:
            print("README.md differs from the template and docs/numbers.json: run make numbers")
            return 1
        return 0
    README.write_text(text)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
