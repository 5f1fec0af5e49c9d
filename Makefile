# One entry point per habit. Every target creates the virtualenv it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test postgres-up lint imports bench bench-compare bench-peers chaos numbers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

# Two processes, a test file to each at a time (a file's fixtures are shared by its tests);
# then, by themselves, the tests that disturb every other one (a server restart).
test: imports $(CHROMIUM) postgres-up
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not alone"
	$(PY) -m pytest -q -m alone

# The PostgreSQL backend's tests need the machine's server running (they create and drop their
# own databases in it); start it if it is not.
postgres-up:
	@pg_isready -q -h 127.0.0.1 -p 5432 || $(SUDO) pg_ctlcluster --skip-systemctl-redirect \
		$$(ls /etc/postgresql) main start
	@pg_isready -h 127.0.0.1 -p 5432

# The dashboard's tests drive the system's Chromium (Debian's package) through playwright.
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# The import contracts in pyproject.toml: who may import whom.
imports: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache

lint: imports
	$(VENV)/bin/ruff check src tests bench scripts examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench.w40 --out bench/results/w40.json
	$(PY) -m bench.workers --out bench/results/workers.json
	$(PY) -m bench.compaction --out bench/results/compaction.json
	$(PY) -m bench.dashboard --out bench/results/dashboard.json
	$(PY) -m bench.throughput --out bench/results/throughput.json
	$(PY) -m bench.postgres --out bench/results/postgres.json
	$(PY) -m bench.scale --out bench/results/scale.json

# This checkout's durabl against durabl 0.1.0 on W40, side by side in one run; 0.1.0 runs in
# its own virtualenv, .bench-venvs/durabl010, built from bench/peers/durabl010.txt.
BASELINE := .bench-venvs/durabl010/.requirements-sha256
$(BASELINE): bench/peers/durabl010.txt
	$(PY) scripts/bench_peers.py --only-venvs --peer durabl010

bench-compare: $(STAMP) $(BASELINE)
	$(PY) -m bench.compare --out bench/results/compare.json

# The durability benchmark over every runtime: builds each peer's virtualenv under .bench-venvs/
# from bench/peers/*.txt, then kills them all (durabl bench --full-matrix).
bench-peers: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) scripts/bench_peers.py --out bench/results/durability

# Every figure the README quotes: collected into docs/numbers.json, rendered into README.md.
numbers: $(STAMP)
	$(PY) scripts/collect_numbers.py
	$(PY) scripts/build_readme.py

# The full chaos grid (both death modes); scripts/chaos_report.py prints its table.
chaos: $(STAMP)
	DURABL_CHAOS=full $(PY) -m pytest tests/chaos -q --timeout=900

clean:
	rm -rf $(VENV) .bench-venvs build src/*.egg-info
