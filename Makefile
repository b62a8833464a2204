# The two commands of the README: `make demo` and `make test`. Each sets itself up.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast test-xla docs docs-serve clean
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

# The documentation site (source docs/, navigation mkdocs.yml) into site/; --strict: a broken link or a missing
# page fails. The docs extra is part of `test`; the stamp installs it into a venv made with other EXTRAS.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -c "import mkdocs, material, mkdocstrings" 2>/dev/null || \
	  $(BIN)/pip install -q -e ".[docs]" -c $(VENV)/torch-pin.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Preview while editing docs/ (bound to 127.0.0.1).
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) $(VENV_XLA) runs build site *.egg-info
