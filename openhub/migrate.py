"""Schema migrations through Alembic (`openhub db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from .config import get_settings


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the store at `url` (default: OPENHUB_DATABASE_URL)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url or get_settings().database_url)
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the store's schema up to `revision`."""
    command.upgrade(alembic_config(url), revision)
