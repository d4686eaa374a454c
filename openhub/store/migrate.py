"""Schema migrations through Alembic (`openhub db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext


def alembic_config(url: str) -> Config:
    """An Alembic configuration for the store at `url` (`openhub db upgrade` gives OPENHUB_DATABASE_URL's)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def current_revision(url: str) -> str | None:
    """The schema revision the store is at (None: no openhub schema yet)."""
    from openhub.store.db import get_engine

    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Bring the store's schema up to `revision`; the revisions (before, after)."""
    before = current_revision(url)
    command.upgrade(alembic_config(url), revision)
    return before, current_revision(url)
