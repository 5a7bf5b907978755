# The commands of the README. Each sets everything up itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist
CONFIG ?= jobs/fedsoft_synthetic.yaml

.PHONY: run test test-all test-gpu check install data clean

run: install data
	$(VENV)/bin/raysoft run $(CONFIG)

# lint, types and the tests not marked slow (each under about 3 s here): the everyday loop
test: check
	$(PY) -m pytest -q -m "not slow"

# everything: lint, types, then every test, the slow end-to-end ones included (what CI runs)
test-all: check
	$(PY) -m pytest -q

# the tests marked gpu: every algorithm on CUDA beside the CPU, packings of GPU actors, resume
# (skipped where torch finds no CUDA; jobs/gpu_check.sh runs them with the GPU benchmark)
test-gpu: install data
	$(PY) -m pytest -q -m gpu

check: install data
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# PYTHON given (PYTHON=python3.12 make run) and .venv made by another Python: made again with it
install: $(STAMP)
	@if [ "$(origin PYTHON)" = "environment" ] || [ "$(origin PYTHON)" = "command line" ]; then \
		want=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
		have=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
		if [ "$$want" != "$$have" ]; then \
			echo "PYTHON=$(PYTHON) is Python $$want but $(VENV) has Python $$have: making $(VENV) again with $(PYTHON)"; \
			rm -rf $(VENV) && $(MAKE) --no-print-directory install; \
		fi; \
	fi

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "raysoft needs Python 3.11+; set PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Fashion-MNIST (rotated-FMNIST experiments) from Debian's package; optional for the default run.
data:
	@if [ -d $(FMNIST) ]; then echo "Fashion-MNIST: $(FMNIST)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
		|| echo "could not install dataset-fashion-mnist; continuing without it"; \
	else echo "Fashion-MNIST not found: install Debian's dataset-fashion-mnist (as root: apt-get install dataset-fashion-mnist) or set RAYSOFT_DATA to a folder with its IDX files; continuing."; fi

clean:
	rm -rf $(VENV) runs .pytest_cache
