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
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

run: install
	$(VENV)/bin/openhub db upgrade
	$(VENV)/bin/openhub dev

# Lint and type-check first (seconds), then the whole suite.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The suite in four pytest processes side by side, each with servers and workers of its own (most of a
# test's time is spent waiting on them: a whole run keeps about one of two cores busy): the chaos files
# (minutes of faults), SPARK (every Spark test, one JVM at a time, and the gevent pool's), SLOW (the promise
# model and its part with real workers, the long pattern file and other long behaviour files) and the rest,
# chosen by the JUnit times in var/junit-*.xml to take about as long each. Each one's report stays in var/
# to rebalance them by.
SPARK := tests/integration/test_pipeline_archive.py tests/integration/test_pipeline_report.py \
	tests/chaos/test_spark_cluster.py tests/integration/test_gevent_pool.py \
	tests/integration/test_slow_receivers.py
# The chaos stream also takes the hostile entries' fuzzing (minutes of generated requests), to balance them.
CHAOS := tests/chaos tests/integration/api/test_fuzz_entries.py
SLOW := tests/integration/test_promise_model.py tests/integration/test_promise_process_model.py \
	tests/integration/test_patterns.py \
	tests/integration/test_status_cli.py tests/acceptance/test_admin_browser.py \
	tests/integration/test_planted_secrets.py tests/integration/test_one_clock.py \
	tests/integration/api/test_serve_limits.py
test: install system-deps lint
	@mkdir -p var
	$(PY) -m pytest $(PYTEST_ARGS) --junitxml=var/junit-chaos.xml --ignore=tests/chaos/test_spark_cluster.py \
	  $(CHAOS) > var/chaos-tests.log 2>&1 & chaos=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) --junitxml=var/junit-spark.xml $(SPARK) > var/spark-tests.log 2>&1 & spark=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) --junitxml=var/junit-slow.xml $(SLOW) > var/slow-tests.log 2>&1 & slow=$$!; \
	$(PY) -m pytest $(PYTEST_ARGS) --junitxml=var/junit-rest.xml $(addprefix --ignore=,$(CHAOS) $(SPARK) $(SLOW)) tests; \
	rest=$$?; wait $$chaos; chaos_rc=$$?; wait $$spark; spark_rc=$$?; wait $$slow; slow_rc=$$?; \
	for stream in spark slow chaos; do echo "--- $$stream (run beside the rest) ---"; cat var/$$stream-tests.log; done; \
	exit $$(( rest || chaos_rc || spark_rc || slow_rc ))

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
