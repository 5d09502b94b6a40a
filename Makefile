# Two entry points: `make demo` (the main job on the built-in digits data) and `make test`.
# Both create .venv and install fedcli into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FLOWER := .venv-flower
FLOWER_STAMP := $(FLOWER)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Flower, for --engine flower, in an environment of its own: it pins typer below 0.21, fedcli's command line
# is built on typer 0.29 (docs/deploy.md)
$(FLOWER_STAMP):
	$(PYTHON) -m venv $(FLOWER)
	$(FLOWER)/bin/python -m pip install --quiet --upgrade pip
	$(FLOWER)/bin/python -m pip install --quiet 'flwr>=1.42,<1.43'
	touch $(FLOWER_STAMP)

demo: $(STAMP)
	$(BIN)/fedcli run recipes/quickstart.toml --exp results/demo

test: $(STAMP) $(FLOWER_STAMP)
	FEDCLI_FLOWER_BIN=$(CURDIR)/$(FLOWER)/bin $(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/dataset_throughput.py
	$(BIN)/python bench/gan_throughput.py
	$(BIN)/python bench/federate_throughput.py
	$(BIN)/python bench/projection_throughput.py
	$(BIN)/python bench/dp_gan_step.py

clean:
	rm -rf $(VENV) $(FLOWER) results/demo .pytest_cache
