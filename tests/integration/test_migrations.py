"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from openhub.db import dispose_engines, get_engine
from openhub.migrate import upgrade
from openhub.schema import Base
from tests.support.backends import postgres_database


def _differences(url: str) -> list:
    upgrade(url)
    upgrade(url)  # a second upgrade is a no-op
    with get_engine(url).connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_sqlite_schema_matches_the_models(tmp_path) -> None:  # noqa: ANN001
    assert _differences(f"sqlite:///{tmp_path / 'store.db'}") == []


def test_postgresql_schema_matches_the_models() -> None:
    with postgres_database("openhub_migrate") as url:
        try:
            assert _differences(url) == []
        finally:
            dispose_engines()


@pytest.mark.parametrize("index", ["ix_messages_due", "ix_messages_funnel", "ix_confirmations_due"])
def test_partial_indexes_exist_on_postgresql(index: str) -> None:
    with postgres_database("openhub_migrate") as url:
        try:
            upgrade(url)
            with get_engine(url).connect() as conn:
                definition = conn.exec_driver_sql("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                                                  (index,)).scalar()
        finally:
            dispose_engines()
    assert definition is not None and " WHERE " in definition
