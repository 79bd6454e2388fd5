# The two commands of the README, plus the benchmark. Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tokensvc needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23"

# setuptools prints a standing caveat with every editable install ("Editable installation ...
# folders with the same name"); it says nothing about this package, which builds without a
# warning (tests/test_packaging.py), so it is filtered here and nowhere else.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

$(VENV)/.installed-run: $(BIN)/python setup.cfg pyproject.toml
	$(EDITABLE) $(BIN)/python -m pip install --quiet -e .
	@touch $@

$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml
	$(EDITABLE) $(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/tokensvc serve --config config/tokensvc.toml

# The linter and the type checker first; then pytest, which exits 5 when it collected no
# test: that is a failure here, never a silent pass.
test: $(VENV)/.installed-test
	$(BIN)/ruff check tokensvc tests bench
	$(BIN)/mypy
	@$(BIN)/python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: no tests ran" >&2; exit 1; fi; exit $$status

# Three rounds, medians: one 10-second run moves with the machine's noise.
bench: $(VENV)/.installed-test
	$(BIN)/python bench/run.py --rounds 3

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
