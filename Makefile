# Two commands on a fresh machine: `make run` (the main job on the shipped default policy) and
# `make test`. Each creates .venv if it is missing and installs what it needs, no more: `run` the
# project with PyYAML, jsonschema, a CPU torch and numpy; `test` adds pytest (with xdist), hypothesis
# and SGLang 0.5.23 with the light pins its start-up code needs (the conform tests). One stamp file per
# step, so `make run` then `make test` installs only the difference.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP     := $(VENV)/.installed-run
CONFORM_STAMP := $(VENV)/.installed-conform
TEST_STAMP    := $(VENV)/.installed-test
# torch is pinned and installed first: an unpinned torch requirement pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# SGLang for `engine.sglang.conform`: the release the conform driver runs, installed with --no-deps next to
# the pinned light dependencies of its start-up code (the `conform` extra, installed --no-deps too);
# skipped on Python 3.10, which it does not support (the conform tests skip there).
SGLANG ?= sglang==0.5.23
CONFORM_DEPS = $(BIN)/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['conform']))"

.PHONY: install run test test-whole bench bench-quick check clean conform-env conform-releases

# everything: what `run` and `test` need
install: $(TEST_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[bridge]'
	touch $@

$(CONFORM_STAMP): $(RUN_STAMP)
	@if $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		echo "$(BIN)/python -m pip install -q --no-deps <the conform extra> $(SGLANG)"; \
		$(BIN)/python -m pip install -q --no-deps $$($(CONFORM_DEPS)) $(SGLANG); \
	else echo "engine.sglang.conform: $(SGLANG) needs Python 3.11 or newer; not installed"; fi
	touch $@

$(TEST_STAMP): $(RUN_STAMP) $(CONFORM_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: $(RUN_STAMP)
	@bash examples/run.sh $(BIN)

# the suite on one pytest worker per CPU (pytest-xdist; TEST_WORKERS=0 runs it in one process)
TEST_WORKERS ?= auto
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# the checks `make test` runs on samples and smaller domains, whole: every shipped version's whole
# domain through the bulk evaluator, diff and lint, conform's larger sample, the whole suite without
# SGLang (tests marked `whole`; CI runs it)
test-whole: $(TEST_STAMP)
	HISPARSE_WHOLE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m whole

check: $(RUN_STAMP)
	$(BIN)/hisparse check policies/

bench: $(TEST_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench

bench-quick: $(TEST_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(BIN)/python -m bench --quick

# `make conform-env SGLANG=0.5.18 [ENVS=DIR]`: an environment running that release's routing code for
# `hisparse conform` (docs/conform.md), outside this checkout: a base environment shared by the
# releases of one transformers version (pins: tools/pins/), the release's wheel first on PYTHONPATH
RELEASE = $(patsubst sglang==%,%,$(SGLANG))
ENVS ?=
conform-env:
	bash tools/sglang-env.sh $(RELEASE) $(ENVS)

# every release a shipped version models, on a 1,000-config stratified sample of its own code
conform-releases: $(TEST_STAMP)
	bash tools/conform-releases.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
