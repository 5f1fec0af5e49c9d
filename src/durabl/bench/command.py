"""``durabl bench`` and ``python -m durabl.bench``: run the benchmark, verify its receipts, and
rebuild its leaderboard from them.

    durabl bench [--full-matrix | --runtimes a,b] [--windows W,..] [--kills N] [--seed S] --out DIR
    durabl bench verify DIR
    durabl bench report DIR

Exit codes: 0 done; 1 the receipts did not verify; 2 bad input (one line on stderr, nothing
written).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from durabl.bench import adapters, board, run, seal
from durabl.bench.seal import BenchInputError

EXIT_OK, EXIT_UNVERIFIED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise BenchInputError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="durabl bench",
        description="Kill agent runtimes with SIGKILL at four windows and measure what survives.",
        epilog="`durabl bench verify DIR` checks a run's receipts; `durabl bench report DIR` "
        "rebuilds its leaderboard from them.",
    )
    parser.add_argument("--full-matrix", action="store_true", help="every runtime, every window")
    parser.add_argument(
        "--runtimes",
        help=f"comma-separated, from: {', '.join(adapters.BY_ID)} (default: durabl,plain)",
    )
    parser.add_argument(
        "--windows", help="comma-separated, from: PROMPT,EXEC,WRITE,VERIFY (default: all)"
    )
    parser.add_argument(
        "--kills", type=int, default=500, help="SIGKILLs over the whole matrix (default 500)"
    )
    parser.add_argument("--seed", type=int, default=0, help="chooses the kill points (default 0)")
    parser.add_argument(
        "--out", type=Path, default=Path("durabl-bench"), help="folder for receipts and leaderboard"
    )
    parser.add_argument(
        "--calibration", type=int, default=5, help="clean runs per runtime (default 5)"
    )
    parser.add_argument(
        "--venvs", type=Path, help="where the peers' virtualenvs are (default .bench-venvs)"
    )
    parser.add_argument(
        "--key-file", type=Path, help=f"the sealing key when ${seal.KEY_VARIABLE} is unset"
    )
    parser.add_argument(
        "--keep-trials", action="store_true", help="keep each trial's folder under DIR/trials"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _folder_parser(name: str, text: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"durabl bench {name}", description=text)
    parser.add_argument("dir", type=Path, help="the --out folder of a bench run")
    parser.add_argument(
        "--key-file", type=Path, help=f"the sealing key when ${seal.KEY_VARIABLE} is unset"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "verify":
            return _verify(
                _folder_parser(
                    "verify", "Check every receipt's seal and the set's completeness."
                ).parse_args(args[1:])
            )
        if args and args[0] == "report":
            return _report(
                _folder_parser(
                    "report", "Rebuild the leaderboard from verified receipts."
                ).parse_args(args[1:])
            )
        return _run(_parser().parse_args(args))
    except BenchInputError as exc:
        print(f"durabl bench: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    if args.kills < 1:
        raise BenchInputError(f"--kills must be at least 1, got {args.kills}")
    if args.calibration < 1:
        raise BenchInputError(f"--calibration must be at least 1, got {args.calibration}")
    options = run.Options(
        adapters=adapters.parse_runtimes(args.runtimes, args.full_matrix),
        windows=run.parse_windows(args.windows),
        kills=args.kills,
        seed=args.seed,
        out=args.out,
        calibration=args.calibration,
        venvs=args.venvs,
        key_file=args.key_file,
        keep_trials=args.keep_trials,
        quiet=args.quiet,
    )
    run.refuse_used_folder(args.out)
    root = adapters.venvs_root(args.venvs)
    for adapter in options.adapters:
        adapters.python_of(adapter, root)  # a missing virtualenv stops the run before it starts
    key = seal.load_key(args.key_file, create=True, out=args.out)
    bench_run = run.run(options, key)
    print(f"bench run {bench_run}: receipts in {args.out / 'receipts'}", file=sys.stderr)
    return _report(argparse.Namespace(dir=args.out, key_file=args.key_file))


def _checked(args: argparse.Namespace) -> seal.Verified:
    if not (args.dir / "receipts").is_dir():
        raise BenchInputError(f"{args.dir} holds no receipts (no {args.dir / 'receipts'} folder)")
    key = seal.load_key(args.key_file, create=False)
    return seal.verify(args.dir, key)


def _verify(args: argparse.Namespace) -> int:
    verified = _checked(args)
    for problem in verified.problems:
        print(f"REJECTED {problem}")
    if not verified.ok:
        print(f"{args.dir}: {len(verified.problems)} problem(s); the receipts do not verify")
        return EXIT_UNVERIFIED
    manifest = verified.manifest or {}
    print(
        f"{args.dir}: {len(verified.receipts)} receipts of bench run {manifest.get('bench_run')} verify"
    )
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    verified = _checked(args)
    if not verified.ok:
        for problem in verified.problems:
            print(f"REJECTED {problem}", file=sys.stderr)
        print(f"durabl bench: {args.dir} does not verify: no leaderboard written", file=sys.stderr)
        return EXIT_UNVERIFIED
    built = board.build(verified.receipts)
    written = board.write(built, args.dir)
    print(board.markdown(built))
    if not any(p.suffix == ".png" for p in written):
        print(
            "(no chart: matplotlib is not installed; pip install 'durabl[bench]')", file=sys.stderr
        )
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return EXIT_OK
