"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from openhub.store.db import dispose_engines, get_engine
from openhub.store.migrate import alembic_config, upgrade
from openhub.store.schema import Base
from tests.support.backends import postgres_database


def _differences(url: str) -> list:
    upgrade(url)
    upgrade(url)  # a second upgrade is a no-op
    with get_engine(url).connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_sqlite_schema_matches_the_models(tmp_path) -> None:
    assert _differences(f"sqlite:///{tmp_path / 'store.db'}") == []


def test_postgresql_schema_matches_the_models() -> None:
    with postgres_database("openhub_migrate") as url:
        try:
            assert _differences(url) == []
        finally:
            dispose_engines()


@pytest.mark.parametrize(
    "index", ["ix_messages_due", "ix_messages_funnel", "ix_confirmations_due", "ix_messages_finished"]
)
def test_partial_indexes_exist_on_postgresql(index: str) -> None:
    with postgres_database("openhub_migrate") as url:
        try:
            upgrade(url)
            with get_engine(url).connect() as conn:
                definition = conn.exec_driver_sql(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (index,)
                ).scalar()
        finally:
            dispose_engines()
    assert definition is not None and " WHERE " in definition


def test_upgrade_keeps_in_flight_entity_records_and_funnels_working(tmp_path) -> None:
    """0003 moves entity records and funnels to their source system's namespace, and marks OK records as
    their owner's last success, so a message mid-retry does not call its done entity step again."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url, "0001")
    now = "2026-11-23 12:00:00"
    with get_engine(url).begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO messages (id, source_system, correlation_id, service, operation, object_id, entity_type, "
            "funnel, payload, state, failed_count, received_at, msg_timestamp, updated_at, attempts, generation) "
            f"VALUES (1, 'CRM', 'c-1', 'customer', 'set', '42', 'customer', 'sku-1', '{{}}', 'PARTLY_FAILED', 1, "
            f"'{now}', '{now}', '{now}', 1, 0)"
        )
        conn.exec_driver_sql(
            "INSERT INTO ext_calls (key, message_id, step_key, scope, state, msg_timestamp, attempts, created_at, "
            f"updated_at) VALUES ('entity:customer:42:mno', 1, 'mno', 'entity', 'OK', '{now}', 1, '{now}', '{now}')"
        )
    upgrade(url)
    with get_engine(url).connect() as conn:
        call = conn.exec_driver_sql("SELECT key, ok_message_id FROM ext_calls").one()
        funnel = conn.exec_driver_sql("SELECT funnel FROM messages").scalar()
    dispose_engines()
    assert tuple(call) == ("entity:CRM:customer:42:mno", 1)
    assert funnel == "CRM:sku-1"


def test_db_upgrade_says_what_it_did(tmp_path) -> None:
    # Issue 40: on an empty database it said "is up to date" after creating the whole schema.
    from click.testing import CliRunner

    from openhub.cli import main

    url = f"sqlite:///{tmp_path / 'store.db'}"
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    try:
        created = CliRunner().invoke(main, ["db", "upgrade", "--url", url], catch_exceptions=False)
        assert created.output == f"database at {url}: schema created (revision {head})\n"
        again = CliRunner().invoke(main, ["db", "upgrade", "--url", url], catch_exceptions=False)
        assert again.output == f"database at {url} is up to date (revision {head})\n"
        older = f"sqlite:///{tmp_path / 'older.db'}"
        upgrade(older, "0001")
        migrated = CliRunner().invoke(main, ["db", "upgrade", "--url", older], catch_exceptions=False)
        assert migrated.output == f"database at {older}: schema migrated from revision 0001 to {head}\n"
    finally:
        dispose_engines()
