# The two commands of the README: `make demo` and `make test`. Each sets itself up.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast clean

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

clean:
	rm -rf $(VENV) runs build *.egg-info
