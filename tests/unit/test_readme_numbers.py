"""Every figure in the README is generated: README.md is docs/README.template.md rendered with
docs/numbers.json, and numbers.json is what scripts/collect_numbers.py reads from its sources
now. When one of them changes, `make numbers` brings the others along; until then this fails."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stored() -> dict:
    return json.loads((REPO / "docs" / "numbers.json").read_text())


def test_the_readme_is_the_template_rendered_with_the_numbers() -> None:
    build = script("build_readme")
    rendered = build.render(build.TEMPLATE.read_text(), stored())
    assert (REPO / "README.md").read_text() == rendered, "README.md is stale: run make numbers"
    assert "{{" not in rendered


def test_the_numbers_are_what_their_sources_say_now() -> None:
    fresh = script("collect_numbers").collect(tests=False)
    numbers = stored()
    for key, value in fresh.items():
        assert numbers[key] == value, f"docs/numbers.json {key!r} is stale: run make numbers"


def test_the_test_count_is_the_suite_s() -> None:
    count = script("collect_numbers").test_count()
    assert stored()["tests"]["count"] == count, "the test count changed: run make numbers"


def test_the_readme_still_starts_with_the_two_commands() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```")]
    assert block == ["make demo", "make test"]
    assert lines.index("```bash") < 4
