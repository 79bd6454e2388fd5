# The two commands of the README, plus the benchmark. Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test check bench chaos clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tokensvc needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23"

# setuptools prints a standing caveat with every editable install ("Editable installation ...
# folders with the same name"); it says nothing about this package, which builds without a
# warning (tests/test_packaging.py), so it is filtered here and nowhere else.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

# tokensvc/__init__.py holds the version the package's metadata takes (setup.cfg's attr:).
$(VENV)/.installed-run: $(BIN)/python setup.cfg pyproject.toml tokensvc/__init__.py
	$(EDITABLE) $(BIN)/python -m pip install --quiet -e .
	@touch $@

$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml tokensvc/__init__.py
	$(EDITABLE) $(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/tokensvc serve --config config/tokensvc.toml

# The response path (the lifecycle, its exit, the response writer, the WebSocket's handshake)
# keeps to Tornado's public interface, and its tests run on the oldest and the newest Tornado
# setup.cfg allows: the whole suite on the venv's (the newest, in a fresh checkout such as
# CI's), then these again with the oldest, installed alone beside the venv and put first on
# the path.
TORNADO_OLDEST := $(shell sed -n 's/^ *tornado>=\([0-9.]*\),.*/\1/p' setup.cfg)
OLDEST_TORNADO := $(VENV)/tornado-$(TORNADO_OLDEST)
RESPONSE_PATH_TESTS := tests/test_response_writer.py tests/test_exit.py tests/test_ws.py tests/test_json_api.py \
	tests/test_body_limit.py

$(OLDEST_TORNADO)/.installed: setup.cfg | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-deps --target $(OLDEST_TORNADO) tornado==$(TORNADO_OLDEST)
	@touch $@

# The suite as setup.cfg defines it, whatever the caller's environment holds: pytest's own
# variables are not taken (a stray PYTEST_ADDOPTS with -x, -k or -m would narrow the gate and
# still pass; PYTEST_PLUGINS and PYTEST_DISABLE_PLUGIN_AUTOLOAD change which plugins run). For
# a narrower run, call $(BIN)/python -m pytest directly.
PYTEST := env -u PYTEST_ADDOPTS -u PYTEST_PLUGINS -u PYTEST_DISABLE_PLUGIN_AUTOLOAD $(BIN)/python -m pytest

# The suite's files are spread over worker processes (pytest-xdist), whole files each, so that a
# module's fixtures start once: most of the suite's time is spent waiting on real processes,
# browsers and stores, so three workers keep two cores busy. The files go out in the order
# tests/conftest.py gives them, the longest first: pytest-xdist would otherwise hand them out by
# their number of tests, and a long file of few tests would start last.
WORKERS ?= 3
DIST := --dist loadfile --no-loadscope-reorder

# The linter and the type checker first; then pytest, which exits 5 when it collected no
# test: that is a failure here, never a silent pass.
test: $(VENV)/.installed-test $(OLDEST_TORNADO)/.installed
	$(BIN)/ruff check tokensvc tests bench
	$(BIN)/mypy
	@$(PYTEST) -n $(WORKERS) $(DIST); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: no tests ran" >&2; exit 1; fi; exit $$status
	PYTHONPATH=$(OLDEST_TORNADO) $(BIN)/python -c 'import tornado; assert tornado.version == "$(TORNADO_OLDEST)", tornado.version; print("the response path on Tornado", tornado.version)'
	PYTHONPATH=$(OLDEST_TORNADO) $(PYTEST) -q $(RESPONSE_PATH_TESTS)

# The fast tier, for the inner loop (CONTRIBUTING.md, The test tiers): the protocol, the store
# contract on memory and mongomock, the service over in-process HTTP. No process is started,
# no browser, no wire tier, no previous release; a test that starts a process fails here.
FAST := not (e2e or wire or upgrade or browser or process)

check: $(VENV)/.installed-test
	@TOKENSVC_TEST_TIER=check $(PYTEST) -q -p no:cacheprovider -n 2 $(DIST) -m "$(FAST)"; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make check: no tests ran" >&2; exit 1; fi; exit $$status

# The production path first (tokensvc serve on the wire tier's replica set beside the memory
# backend: CPU and store commands a request), then wrk's throughput: three rounds, medians, as
# one 10-second run moves with the machine's noise.
bench: $(VENV)/.installed-test
	$(BIN)/python bench/production.py
	$(BIN)/python bench/run.py --rounds 3

# The store chaos run (docs/guide/operations.md), on the wire tier's stand-in for a replica set:
# make chaos CHAOS="--seconds 60 --seed 7".
chaos: $(VENV)/.installed-test
	$(BIN)/python bench/chaos.py $(CHAOS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
