"""openhub.core.live: every setting is listed with its fields, a live value parses as the environment's does,
and a value shown is the one that parses back (what `openhub config` prints can be set again as it is)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from openhub.core import live
from openhub.core.config import Settings
from openhub.core.errors import ConfigurationError

EXAMPLES = {
    "OPENHUB_RETRY_INTERVAL": "2.5",
    "OPENHUB_MAX_FAILS": "7",
    "OPENHUB_POSTPONE_INTERVAL": "30",
    "OPENHUB_SYSTEM_LIMITS": "billing=2,crm=4",
    "OPENHUB_SYSTEM_RATES": "billing=10/1,crm=100/60",
    "OPENHUB_BREAKER_FAILURES": "9",
    "OPENHUB_BREAKER_OPEN": "120",
    "OPENHUB_CONFIRM_MAX_FAILS": "5",
    "OPENHUB_CONFIRM_INTERVAL": "15",
    "OPENHUB_WEBHOOK_STATES": "FAILED,OK",
    "OPENHUB_LOG_LEVEL": "debug",
}


def test_every_variable_settings_reads_is_listed_with_fields_it_has() -> None:
    source = (Path(live.__file__).parent / "config.py").read_text()
    assert set(re.findall(r'"(OPENHUB_[A-Z_]+)"', source)) == set(live.SETTINGS)
    fields = set(Settings.__dataclass_fields__)
    assert {f for names in live.SETTINGS.values() for f in names} <= fields
    assert live.LIVE <= set(live.SETTINGS) and live.SECRET <= set(live.SETTINGS)
    assert set(EXAMPLES) == live.LIVE


@pytest.mark.parametrize("name", sorted(live.LIVE))
def test_a_live_value_parses_as_the_environments_and_shows_as_it_was_given(name: str) -> None:
    fields = live.parse_live(name, EXAMPLES[name])
    assert fields == {f: getattr(Settings.from_env({name: EXAMPLES[name]}), f) for f in live.SETTINGS[name]}
    shown = live.shown(fields[live.SETTINGS[name][0]])
    assert live.parse_live(name, shown) == fields, shown
    applied = live.with_overrides(Settings.from_env({}), {name: EXAMPLES[name]})
    assert applied.live_overrides == ((name, EXAMPLES[name]),) and applied.before_overrides is not None
    assert live.driver_settings(applied) is applied.before_overrides


def test_refusals_name_the_setting_and_say_why() -> None:
    with pytest.raises(live.UnknownSetting, match="OPENHUB_NOPE is not an openhub setting"):
        live.parse_live("OPENHUB_NOPE", "1")
    with pytest.raises(live.NeedsRestart, match="OPENHUB_BROKER_URL is not safe to change at run time"):
        live.parse_live("OPENHUB_BROKER_URL", "redis://")
    with pytest.raises(ConfigurationError, match="OPENHUB_CONFIRM_INTERVAL must be a number of seconds"):
        live.parse_live("OPENHUB_CONFIRM_INTERVAL", "often")
    assert live.usable({"OPENHUB_MAX_FAILS": "x", "OPENHUB_BREAKER_OPEN": "5"}) == {"OPENHUB_BREAKER_OPEN": "5"}


def test_secrets_and_credentials_in_urls_are_masked() -> None:
    env = {
        "OPENHUB_ADMIN_TOKEN": "t" * 40,
        "OPENHUB_DATABASE_URL": "postgresql://hub:s3cret-pass@db/openhub",
        "OPENHUB_API_KEYS": "CRM=" + "k" * 40,
    }
    rows = {r["name"]: r for r in live.in_force(Settings.from_env(env), env)}
    assert rows["OPENHUB_ADMIN_TOKEN"] == {
        "name": "OPENHUB_ADMIN_TOKEN",
        "value": "***",
        "source": "environment",
        "live": False,
    }
    assert rows["OPENHUB_API_KEYS"]["value"] == "***"
    assert rows["OPENHUB_DATABASE_URL"]["value"] == "postgresql://***@db/openhub"
    assert rows["OPENHUB_METRICS_TOKEN"] == {
        "name": "OPENHUB_METRICS_TOKEN",
        "value": "",
        "source": "default",
        "live": False,
    }
    assert rows["OPENHUB_MAX_FAILS"]["source"] == "default"
