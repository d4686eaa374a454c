"""Live configuration (issue 36, item 5) across processes: a retry interval an admin changes through the API is
used by the next retry on a real `celery -A tasks worker` process, which shows it in its snapshot, and the value
forgotten, the environment's again; `openhub config` shows each setting's source with secrets masked and changes
live ones; the store away while a process refreshes keeps the settings in force and fails no step.
(The API's own refusals and roles: tests/integration/api/test_config_api.py.)"""

from __future__ import annotations

import logging
import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

import openhub
from openhub.cli import main
from openhub.core.config import get_settings
from openhub.service import settings as live_settings
from openhub.store import audit
from openhub.store.schema import messages
from openhub.testing import LocalHub
from tests.integration.api.conftest import ADMIN, make_client
from tests.support import backends
from tests.support.process_store import store_now, transaction
from tests.support.waiting import wait_final, wait_for
from tests.support.workers import Worker


def _snapshot(client: Any, kind: str, name: str, value: str, source: str) -> list[dict[str, Any]] | None:
    """The settings of the newest process of `kind`, once they have `name` at `value` from `source`."""
    for snap in client.get("/api/v1/config", headers=ADMIN).json()["processes"]:
        if snap["kind"] == kind and {"name": name, "value": value, "source": source, "live": True} in snap["settings"]:
            return list(snap["settings"])
    return None


def _due_after_failure(message_id: int) -> Any:
    with transaction() as conn:
        row = conn.execute(select(messages.c.state, messages.c.due_at).where(messages.c.id == message_id)).first()
    return row.due_at if row is not None and row.state == "PARTLY_FAILED" and row.due_at is not None else None


def _submit(prefix: str) -> int:
    return openhub.submit("test.flow", {"prefix": prefix}, source_system="CRM", correlation_id=uuid.uuid4().hex).id


@pytest.mark.parametrize("name", ["embedded", "redis-pg"])
def test_a_retry_interval_changed_at_run_time_is_used_by_the_next_retry_on_a_worker_process(
    name, tmp_path, external, prefix
) -> None:
    """A worker of one process (so the process that shows the change is the one that runs the step), started
    with OPENHUB_RETRY_INTERVAL=0.3 (tests/support/backends.py): told 60 s through the API, within a poll
    interval its snapshot says so, and a step failing after that is due a minute later; the value forgotten,
    the next failure is retried at once again."""
    before_env = {k: v for k, v in os.environ.items() if k.startswith("OPENHUB_")}
    try:
        with backends.backend(name, tmp_path / name, {"OPENHUB_TEST_EXTERNAL_URL": external.url}) as own:
            with Worker(own.env, own.workdir, concurrency=1, name="live").start() as worker, make_client() as client:
                started = wait_for(
                    lambda: _snapshot(client, "worker", "OPENHUB_RETRY_INTERVAL", "0.3", "environment"),
                    30,
                    lambda: (
                        f"the worker's snapshot: {client.get('/api/v1/config', headers=ADMIN).text[:3000]}\n"
                        + worker.log()[-3000:]
                    ),
                )
                assert {"name": "OPENHUB_MAX_FAILS", "value": "3", "source": "default", "live": True} in started
                r = client.put(
                    "/api/v1/config/OPENHUB_RETRY_INTERVAL",
                    json={"value": "60", "reason": "partner down"},
                    headers=ADMIN,
                )
                assert r.status_code == 200, r.text
                wait_for(
                    lambda: _snapshot(client, "worker", "OPENHUB_RETRY_INTERVAL", "60", "store"),
                    10,
                    lambda: "the worker to take the new value\n" + worker.log()[-3000:],
                )

                external.fail(f"{prefix}-slow/a", times=1)
                failed_after = store_now()
                slow = _submit(f"{prefix}-slow")
                due = wait_for(lambda: _due_after_failure(slow), 30, "the first attempt to fail")
                assert due - failed_after >= timedelta(seconds=55), due - failed_after
                assert due - store_now() <= timedelta(seconds=61)
                openhub.cancel(slow)

                r = client.delete("/api/v1/config/OPENHUB_RETRY_INTERVAL", headers=ADMIN)
                assert r.status_code == 200 and r.json()["value"] == "0.3" and r.json()["source"] == "environment"
                wait_for(
                    lambda: _snapshot(client, "worker", "OPENHUB_RETRY_INTERVAL", "0.3", "environment"),
                    10,
                    "the worker to take the environment's value again",
                )
                external.fail(f"{prefix}-fast/a", times=1)
                fast = _submit(f"{prefix}-fast")
                assert wait_final(fast, 30).state == "OK"
                assert [e["action"] for e in audit.entries(who="admin", url=get_settings().database_url)] == [
                    "config.unset",
                    "config.set",
                ]
            assert "live settings in force: {'OPENHUB_RETRY_INTERVAL': '60'}" in worker.log()
    finally:
        backends.activate(before_env)


def test_openhub_config_shows_sources_masks_secrets_and_changes_live_settings(backend) -> None:
    secret = "admin-" + uuid.uuid4().hex
    env = dict(
        backend.env,
        OPENHUB_ADMIN_TOKEN=secret,
        OPENHUB_WEBHOOK_URL=f"https://hooks:{secret}@hooks.example/notify",
        OPENHUB_CONFIRM_SECRETS=f"CRM=whsec_{uuid.uuid4().hex}{uuid.uuid4().hex}",
    )
    backends.activate(env)
    runner = CliRunner()
    try:
        shown = runner.invoke(main, ["config"], catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        assert secret not in shown.output and "whsec_" not in shown.output
        assert "  OPENHUB_ADMIN_TOKEN=***\t[environment]" in shown.output
        assert "  OPENHUB_CONFIRM_SECRETS=***\t[environment]" in shown.output
        assert "  OPENHUB_WEBHOOK_URL=https://***@hooks.example/notify\t[environment]" in shown.output
        assert "  OPENHUB_RETRY_INTERVAL=0.3\t[environment]  (live)" in shown.output
        assert "  OPENHUB_LOG_LEVEL=\t[default]  (live)" in shown.output
        assert "changeable at run time (openhub config set NAME VALUE): OPENHUB_BREAKER_FAILURES" in shown.output

        done = runner.invoke(main, ["config", "set", "OPENHUB_BREAKER_FAILURES", "8", "--reason", "noisy"])
        assert done.exit_code == 0 and "OPENHUB_BREAKER_FAILURES=8 (was not set in the store)" in done.output
        shown = runner.invoke(main, ["config"], catch_exceptions=False).output
        assert "  OPENHUB_BREAKER_FAILURES=8\t[store]  (live)" in shown
        assert "live value OPENHUB_BREAKER_FAILURES=8 set by local:" in shown and ": noisy" in shown
        refused = runner.invoke(main, ["config", "set", "OPENHUB_ROUTES", "elsewhere"])
        assert refused.exit_code == 1 and "OPENHUB_ROUTES is not safe to change at run time" in refused.output
        bad = runner.invoke(main, ["config", "set", "OPENHUB_BREAKER_OPEN", "a while"])
        assert bad.exit_code == 1 and "OPENHUB_BREAKER_OPEN must be a number of seconds" in bad.output
        done = runner.invoke(main, ["config", "unset", "OPENHUB_BREAKER_FAILURES"])
        assert done.exit_code == 0 and "OPENHUB_BREAKER_FAILURES=3 [environment] (was 8)" in done.output
        trail = [
            e
            for e in audit.entries(action=None, limit=10, url=get_settings().database_url)
            if e["target"] == "OPENHUB_BREAKER_FAILURES"
        ]
        assert [e["action"] for e in trail][:2] == ["config.unset", "config.set"]
        assert trail[0]["who"].startswith("local:")
        as_json = runner.invoke(main, ["config", "--json"], catch_exceptions=False)
        assert secret not in as_json.output and '"values": []' in as_json.output
    finally:
        backend.activate()


def test_the_store_away_while_a_process_refreshes_keeps_the_settings_in_force_and_fails_no_step(
    local_store_env, external, prefix, caplog
) -> None:
    """The live values' table taken away (renamed) under a LocalHub whose every entry point reads it: the
    message is carried to OK, the value set before is still in force, and the failure is logged once."""
    with LocalHub(
        "tests.support.routes",
        OPENHUB_TEST_EXTERNAL_URL=external.url,
        OPENHUB_POLL_INTERVAL="0.001",  # every entry point reads the store's values
        **local_store_env,
    ) as local:
        assert local.hub is not None
        hub = local.hub
        live_settings.set_setting("OPENHUB_MAX_FAILS", "6", hub=hub)
        assert hub.settings.max_fails == 6 and hub.settings.live_overrides == (("OPENHUB_MAX_FAILS", "6"),)
        with hub.transaction() as conn:
            conn.execute(text("ALTER TABLE live_settings RENAME TO live_settings_away"))
        try:
            with caplog.at_level(logging.WARNING, logger="openhub.config"):
                message = local.submit("test.flow", {"prefix": prefix})
                local.run()
                local.tick()
                hub.refresh(force=True)
            assert local.get(message.id).state == "OK"
            assert hub.settings.max_fails == 6
            away = [r for r in caplog.records if "live settings not read" in r.getMessage()]
            assert len(away) == 1, [r.getMessage() for r in caplog.records]
        finally:
            with hub.transaction() as conn:
                conn.execute(text("ALTER TABLE live_settings_away RENAME TO live_settings"))
            live_settings.unset_setting("OPENHUB_MAX_FAILS", hub=hub)
        assert hub.settings.max_fails == 3 and hub.settings.live_overrides == ()


def test_the_webhook_states_and_the_log_level_changed_at_run_time_apply_where_they_are_read(
    local_store_env, external
) -> None:
    """The stock webhook's states live in the registry (its hook was declared with the states of start-up), the
    log level in the "openhub" loggers: a live change reaches both, and forgotten, the start-up ones again."""
    with LocalHub(
        "tests.support.routes",
        OPENHUB_WEBHOOK_URL=f"{external.url}/hook",
        OPENHUB_WEBHOOK_STATES="FAILED",
        **local_store_env,
    ) as local:
        assert local.hub is not None
        hub, logger = local.hub, logging.getLogger("openhub")
        assert hub.registry.hooks_for("OK") == [] and hub.registry.hooks_for("FAILED") == ["webhook"]
        try:
            live_settings.set_setting("OPENHUB_WEBHOOK_STATES", "failed,ok", hub=hub)
            live_settings.set_setting("OPENHUB_LOG_LEVEL", "DEBUG", hub=hub)
            assert hub.registry.hooks_for("OK") == ["webhook"] and hub.registry.hooks_for("FAILED") == ["webhook"]
            assert logger.level == logging.DEBUG and hub.settings.log_level == "debug"
        finally:
            live_settings.unset_setting("OPENHUB_WEBHOOK_STATES", hub=hub)
            live_settings.unset_setting("OPENHUB_LOG_LEVEL", hub=hub)
        assert hub.registry.hooks_for("OK") == [] and logger.level == logging.NOTSET
