# The two commands: `make run` (the platform with demo data) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint format bench clean install chromium promtool

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed (set PYTHON=...)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## make run: web on :8000, a delivery worker, a demo receiver and demo traffic. Ctrl-C stops all.
run: install
	$(BIN)/python manage.py runplatform

## make chromium: the system Chromium the browser tests drive (Playwright never downloads one).
CHROMIUM ?= /usr/bin/chromium
chromium:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Chromium for the browser tests (apt-get install chromium)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	  echo "The browser tests need Chromium at $(CHROMIUM): install it (Debian: sudo apt-get install chromium)," >&2; \
	  echo "or run 'make test-fast', which skips them." >&2; \
	  exit 1; \
	fi

## make promtool: Prometheus's promtool, which checks and unit-tests deploy/prometheus/alerts.yml
## (tests/dashboards/test_alert_rules.py). PROMTOOL=/path/to/promtool picks another one; it is
## exported so the test runs the same binary.
PROMTOOL ?= promtool
export PROMTOOL
promtool:
	@if command -v "$(PROMTOOL)" >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing promtool for the alert rule tests (apt-get install prometheus)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
	    && { command -v "$(PROMTOOL)" >/dev/null 2>&1 || { echo "apt-get installed prometheus, but $(PROMTOOL) is still not found" >&2; exit 1; }; }; \
	else \
	  echo "The alert rule tests need Prometheus's promtool ($(PROMTOOL)): install it" >&2; \
	  echo "(Debian: sudo apt-get install --no-install-recommends prometheus; or a release from" >&2; \
	  echo "https://prometheus.io/download/), or point PROMTOOL=/path/to/promtool at one." >&2; \
	  exit 1; \
	fi

## make test: the whole suite against a real Redis (REDIS_URL, else embedded) and the configured DB.
test: install chromium promtool
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## make test-fast: skip the slow end-to-end, chaos and browser tests while iterating.
test-fast: install promtool
	$(BIN)/python -m pytest -m "not slow and not chaos and not browser" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python bench/scheduler.py

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
