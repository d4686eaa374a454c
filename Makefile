# Two commands for a newcomer: `make run` (the hub on the embedded default) and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
PYTEST_ARGS ?=

.PHONY: run test test-burn lint install system-deps check-deploy bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -e '.[dev,spark]'
	touch $@

install: $(VENV)/.installed

# Debian packages the tests use: JDBC drivers for Spark, promtool for the alert rules,
# Chromium for the admin page's browser test, nftables for the multi-host rig's partitions. Skipped when
# already there.
system-deps:
	@missing=""; \
	for p in libpostgresql-jdbc-java libxerial-sqlite-jdbc-java prometheus chromium nftables iproute2; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

run: install
	$(VENV)/bin/openhub db upgrade
	$(VENV)/bin/openhub dev

# Lint and type-check first (seconds), then the whole suite.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The chaos files (minutes of faults, each test on servers and workers of its own) run beside the
# rest, in a second pytest; their report follows the main one.
test: install system-deps lint
	@mkdir -p var
	$(PY) -m pytest $(PYTEST_ARGS) tests/chaos > var/chaos-tests.log 2>&1 & chaos=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) --ignore=tests/chaos tests; rest=$$?; \
	wait $$chaos; chaos_rc=$$?; \
	echo "--- tests/chaos (run beside the rest) ---"; cat var/chaos-tests.log; \
	exit $$(( rest || chaos_rc ))

# The whole suite on a busy machine: `make test` beside BURN processes spinning on the CPU (4 by default,
# twice CI's 2 cores; tests/support/burner.py). A test that fails only here is a flaky test.
BURN ?= 4
test-burn: install
	$(PY) -m tests.support.burner --processes $(BURN) -- $(MAKE) --no-print-directory test

check-deploy: install system-deps
	$(PY) -m pytest $(PYTEST_ARGS) tests/acceptance -k deploy

bench: install
	$(PIP) install -q -e '.[bench]'
	PYTHONPATH=. $(PY) bench/peers.py
	PYTHONPATH=. $(PY) bench/throughput.py

clean:
	rm -rf var .pytest_cache
