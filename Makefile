# The newcomer's entry points. `make test` and `make bench` set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps test bench train lint lock clean

setup: $(STAMP)

# torch is pinned and installed first, so that a looser requirement cannot pull another build.
# From PyPI on Linux x86-64 that pin is the CUDA build (a few GB, what a GPU machine wants); on a
# CPU-only machine with internet, `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu`
# installs the CPU build instead.
TORCH_INDEX ?=
# The other libraries are held to the versions the tests last passed with (constraints.txt);
# `make clean setup CONSTRAINTS=` takes the newest allowed instead; `make lock` records what .venv has.
CONSTRAINTS ?= constraints.txt
# pip compiles each package's bytecode on one core; compileall afterwards uses every core (~30 s
# less on 2 cores). A file that does not compile (some packages ship templates as .py) is skipped,
# as pip skips it, hence `|| true`.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q --no-compile -e ".[dev]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	@$(MAKE) --no-print-directory system-deps
	touch $(STAMP)

# The isolated sandbox needs bubblewrap; without it (or without root) vivace falls back to
# the plain, unisolated backend with a loud warning and the isolation tests are skipped.
# ripgrep makes the grep tool fast; without it grep uses its built-in (slower) fallback.
system-deps:
	@for pkg in bwrap:bubblewrap rg:ripgrep; do \
		cmd=$${pkg%%:*}; deb=$${pkg#*:}; \
		if command -v $$cmd >/dev/null 2>&1; then continue; fi; \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get install -y -qq $$deb >/dev/null 2>&1 || \
			 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$deb >/dev/null 2>&1)) || \
			echo "warning: could not install $$deb"; \
		else echo "note: install $$deb (as root) for the full sandbox and tools"; fi; \
	done

# The tests in parallel (pytest-xdist), one worker per core up to 4 (tests/conftest.py); most of
# them wait on subprocesses, sandboxes and servers. `make bench` runs the slow ones serially: they time.
test: setup
	$(BIN)/pytest -q -n auto --dist worksteal

bench: setup
	$(BIN)/pytest -q -m slow
	$(BIN)/vivace sandbox bench --n 500 --concurrency 32 --json
	$(BIN)/vivace serve bench --model tiny --json
	$(BIN)/vivace train bench-pipeline --json

# RL on the built-in defaults (the tiny preset: the learnable task families, 2 CPU cores).
train: setup
	$(BIN)/vivace train

lint: setup
	$(BIN)/ruff check src tests scripts

# After `make clean setup CONSTRAINTS=` and a passing `make test`: record the versions that passed.
lock: setup
	{ sed -n '/^#/p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -iv '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
