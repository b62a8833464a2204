# The two commands of the README: `make demo` and `make test`. Each sets itself up.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast test-xla docs clean
VENV_XLA ?= .venv-xla

$(STAMP): pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

install: $(STAMP)

# Train the default model (gpt-tiny on the Python standard library's source) on CPU and print the report.
demo: $(STAMP)
	$(BIN)/trainperf train configs/gpt-tiny.yaml --set run.dir=runs/demo --resume never

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests -m "not slow and not distributed"

# Tests marked `xla` on the CPU PJRT device, in their own venv (torch 2.9.1 + torch-xla 2.9.0):
# ~4 GB download and ~8 min to build once (x86-64: PyPI's torch 2.9.1 is the CUDA build), ~3-6 min per run.
test-xla:
	bash scripts/test_xla.sh $(VENV_XLA)

# README.md and BENCHMARKS.md are generated: edit docs/ (head, docs/fragments/<area>-*.md, tail), then this.
docs:
	python3 scripts/assemble_docs.py

clean:
	rm -rf $(VENV) $(VENV_XLA) runs build *.egg-info
