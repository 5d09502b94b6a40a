# Two entry points: `make demo` (the main job on the built-in digits data) and `make test`.
# Both create .venv and install fedcli into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedcli run recipes/quickstart.toml --exp results/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/dataset_throughput.py
	$(BIN)/python bench/gan_throughput.py
	$(BIN)/python bench/federate_throughput.py
	$(BIN)/python bench/projection_throughput.py
	$(BIN)/python bench/dp_gan_step.py

clean:
	rm -rf $(VENV) results/demo .pytest_cache
