# inturn: the README's commands. `make demo` runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test test-fast test-store lint typecheck docs bench crd clean image

$(STAMP): pyproject.toml
	@echo "installing inturn and its dependencies into $(VENV) (once; about a minute, quiet)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# The tests run in two parts: first in parallel, pytest-xdist's JOBS workers (6 by default on
# the two-core machine: the slow tests wait on processes, servers and timeouts more than they
# compute; the parallel part took 836 s with 2 workers, 537 with 4 and 469 with 6), each its own
# embedded Postgres, databases, ports and folders, a test file at a time (the longest files
# first, the benchmarks' tiny runs one by one: tests/support/schedule.py); then, one at a time,
# the tests marked `serial` (a fixed port, timing, a memory limit, a partition: they must run
# alone). The second part runs even when the first failed, and the target fails when either did
# (pytest's 5, "no test selected", is no failure there). Each part names what it skipped and why
# (-rs): a test that skips itself on a condition that comes and goes shows in the count only.
JOBS     ?= 6
PARALLEL ?= -n $(JOBS) --dist loadfile
define two_parts
	$(BIN)/pytest -q -rs $(PARALLEL) -m "$(if $(1),($(1)) and )not serial"; first=$$?; \
	$(BIN)/pytest -q -rs -m "$(if $(1),($(1)) and )serial"; second=$$?; \
	[ $$second -eq 5 ] && second=0; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]
endef

test: $(STAMP)
	$(call two_parts,)

# The edit-test loop: one parallel part, without the tests marked `slow` (faults, outages,
# clusters of their own, whole processes, long runs; every `acceptance` and `serial` test is
# `slow` too, tests/conftest.py), so nothing is left to run alone after it.
test-fast: $(STAMP)
	$(BIN)/pytest -q $(PARALLEL) -m "not slow"

# The loop's tests compute more than they wait: 3 workers (one more than the cores) ran them in
# 210 s where 2 took 339, both at load 4 to 5 (docs/explanation/architecture.md, Tests).
# JOBS=N on the command line still sets it.
test-fast: JOBS = 3

# pytest keeps the test modules it rewrote (asserts) in __pycache__ unless Python is told to write
# no bytecode: a second run's collection then takes 12 s a worker instead of 20.
test test-fast test-store: export PYTHONDONTWRITEBYTECODE =

# The store tests alone, e.g. against the system Postgres:
#   INTURN_TEST_DSN=postgresql://postgres@127.0.0.1:5432/postgres make test-store
test-store: $(STAMP)
	$(call two_parts,store)

# mypy cannot see the directory mapping (worker/ -> inturn.worker), so it reads the package
# through a tree of symlinks under build/.
typecheck: $(STAMP)
	@mkdir -p build/typecheck/inturn
	@ln -sfn ../../../worker build/typecheck/inturn/worker
	@ln -sfn ../../../operator build/typecheck/inturn/operator
	MYPYPATH=build/typecheck $(BIN)/mypy -p inturn.worker -p inturn.operator

lint: $(STAMP) typecheck docs
	$(BIN)/lint-imports
	$(BIN)/python -m tests.support.prometheus_rules check
	$(BIN)/ruff check worker operator tests bench examples image docs
	$(BIN)/ruff format --check worker operator tests bench examples image docs

# The documentation site (Sphinx, MyST Markdown) into build/docs/, warnings as errors: a broken
# link, a page outside every toctree or a reference page that cannot be generated fails it.
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs build/docs

bench: $(STAMP)
	$(BIN)/python bench/delivery.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/operator.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/pooler.py
	$(BIN)/python bench/console.py
	$(BIN)/python bench/queue_depth.py
	$(BIN)/python bench/sweep.py
	$(BIN)/python bench/retention.py
	$(BIN)/python bench/weather.py
	$(BIN)/python bench/failover.py
	$(BIN)/python bench/partition.py
	$(BIN)/python bench/shapes.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/latency.py
	$(BIN)/python bench/lanes.py
	$(BIN)/python bench/resend.py
	$(BIN)/python bench/filters.py
	$(BIN)/python bench/profiles.py
	$(BIN)/python bench/fanout.py

# The container image, built with podman from the Containerfile on a base made here by
# debootstrap, then checked inside (version, every command's help, user, no compiler, size).
# Root, podman and debootstrap needed. IMAGE=registry.example.com/inturn:0.1.0 to name it.
image:
	image/build.sh $(IMAGE)

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
