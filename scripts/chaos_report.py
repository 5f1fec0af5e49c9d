"""Run the chaos grid and report it (SPEC §11).

    python scripts/chaos_report.py            # the full grid (what `make chaos` runs)
    python scripts/chaos_report.py --sample   # the default suite's sample

Prints the table of crash points (how many counted scenarios died at each, as their first death
and as a later one taken while recovering, per death mode), the scenario counts (counted, skipped, deaths), duplicates,
divergences from the reference, oracle failures and disagreements between the two death modes,
and writes it all to docs/chaos_report.json. A progress bar runs on stderr. Exits 1 when any
scenario broke an oracle or the two modes disagreed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from chaos import grid  # noqa: E402
from chaos.corpus import CORPUS  # noqa: E402
from chaos.lives import MODES  # noqa: E402
from durabl import crashpoints  # noqa: E402

ELSEWHERE = {
    "compaction": "not in this grid (its oracles read the whole log, which compaction folds "
    "away); deaths inside a compaction are covered by tests/oracles/test_compaction.py (a death "
    "at every line one executes, and a killed transaction), and compaction between random "
    "crashes, resumes and operator actions by the state machine in tests/chaos/test_stateful.py",
    "parallel branches at once": "the grid's chaos.parallel runs its branches one at a time, so "
    "that a (point, occurrence) names the same instant in every process and in both death "
    "modes; its twin whose branches run at once (chaos.parallel.at_once) is killed at every "
    "occurrence of every point, in both modes, by tests/chaos/test_grid.py, with every oracle "
    "but the agreement of the modes",
}


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, width: int = 32) -> None:
        self.width = width
        self.started_s = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        elapsed_s = time.monotonic() - self.started_s
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} first deaths "
            f"{elapsed_s:6.1f} s"
        )
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def summarise(tally: grid.Tally, grid_name: str) -> dict[str, Any]:
    points: dict[str, Any] = {}
    for point in crashpoints.ALL:
        row: dict[str, Any] = {}
        for mode in MODES:
            counted = tally.counted(mode)
            row[mode] = {
                "first_death": sum(1 for v in counted if v.plan[0].point == point),
                "later_death": sum(1 for v in counted if any(d.point == point for d in v.plan[1:])),
            }
        row["total"] = tally.per_point()[point]
        points[point] = row
    modes = {}
    for mode in MODES:
        counted = tally.counted(mode)
        modes[mode] = {
            "scenarios": len(counted),
            "deaths": tally.deaths(mode),
            "skipped": tally.skipped_in(mode),
            "by_deaths": {
                str(n): c for n, c in sorted(Counter(len(v.plan) for v in counted).items())
            },
            "dead_lettered": sum(1 for v in counted if v.dead_letters),
            "duplicates": sum(1 for v in tally.verdicts if v.mode == mode and v.duplicates),
            "divergences": sum(1 for v in tally.verdicts if v.mode == mode and v.diverged),
            "failures": sum(1 for v in tally.verdicts if v.mode == mode and v.failures),
        }
    return {
        "grid": grid_name,
        "seconds": round(tally.seconds, 1),
        "workflows": [spec.name for spec in CORPUS],
        "crash_points": list(crashpoints.ALL),
        "scenarios": len(tally.counted()),
        "deaths": tally.deaths(),
        "skipped": len(tally.skipped),
        "duplicates": sum(m["duplicates"] for m in modes.values()),
        "divergences": sum(m["divergences"] for m in modes.values()),
        "failures": tally.failures[:50],
        "mode_disagreements": grid.disagreements(tally)[:50],
        "modes": modes,
        "points": points,
        "covered_elsewhere": ELSEWHERE,
    }


def render(report: dict[str, Any]) -> str:
    kinds = ("first_death", "later_death")
    head = f"{'crash point':24} " + " ".join(
        f"{mode + ' ' + kind.replace('_', ' '):>22}" for mode in MODES for kind in kinds
    )
    lines = [f"chaos grid ({report['grid']}): {report['seconds']} s", "", head + f" {'total':>8}"]
    for point, row in report["points"].items():
        cells = " ".join(f"{row[mode][kind]:>22}" for mode in MODES for kind in kinds)
        lines.append(f"{point:24} {cells} {row['total']:>8}")
    lines.append("")
    for mode, m in report["modes"].items():
        lines.append(
            f"{mode:10} {m['scenarios']:6} scenarios counted ({m['by_deaths']} by deaths), "
            f"{m['deaths']} deaths, {m['skipped']} skipped, {m['dead_lettered']} through a dead "
            f"letter; duplicates {m['duplicates']}, divergences {m['divergences']}, "
            f"failures {m['failures']}"
        )
    lines += [
        f"total      {report['scenarios']:6} scenarios counted, {report['deaths']} deaths, "
        f"{report['skipped']} skipped; duplicates {report['duplicates']}, divergences "
        f"{report['divergences']}, mode disagreements {len(report['mode_disagreements'])}",
        "",
        "covered elsewhere:",
        *(f"  {name}: {why}" for name, why in report["covered_elsewhere"].items()),
        *report["failures"][:10],
        *report["mode_disagreements"][:10],
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", action="store_true", help="run the default suite's sample")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "chaos_report.json")
    parser.add_argument("--workers", type=int, default=None, help="worker processes")
    args = parser.parse_args(argv)
    name = "sample" if args.sample else "full"
    scratch = grid.scratch_dir()
    try:
        tally = grid.run_grid(
            scratch,
            grid.SAMPLE if args.sample else grid.FULL,
            workers=args.workers,
            progress=Progress(),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = summarise(tally, name)
    print(render(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    clean = not (report["failures"] or report["mode_disagreements"])
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
