"""The unmanaged baseline: a plain Python loop with its state in memory.

Nothing is persisted, so a restarted process starts the run over from the first step. This is
what every agent is before a runtime: the floor for per-step cost and the ceiling for loss.

Windows: PROMPT and EXEC inside the step bodies (``agent.Trial.run_step``); WRITE never arrives
(nothing is written); VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent


def main() -> None:
    trial = agent.Trial.from_env()
    trial.ready(runtime="plain", version=platform.python_version(), import_s=0.0, init_s=0.0)
    outputs: dict = {}
    for name in agent.STEP_NAMES:
        outputs[name] = trial.run_step(name, agent.step_input(name, outputs))
    trial.finish(agent.final_result(outputs))


def check(trial: agent.Trial) -> tuple[bool, str]:
    return True, "nothing is stored"


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        started = time.perf_counter()
        main()
