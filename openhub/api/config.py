"""/api/v1/config: the settings in force and where each came from, and an admin's changes to the live ones.

`GET` is the admins' (the settings name every system, URL and limit of the deployment; secrets are masked
anyway); `PUT /api/v1/config/{name}` keeps a live value in the store and `DELETE` forgets it, so the
environment's value or the default applies again: each within one poll interval on every process, each
audited (`config.set`, `config.unset`). A bad value is 400 naming the setting, a setting read only at
start-up 409 (it needs a restart), an unknown one 404; nothing is stored.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from openhub.api.auth import Caller, admin
from openhub.api.problems import NO_CONTROL, refusals
from openhub.api.served import ServedHub
from openhub.service import settings

router = APIRouter(prefix="/api/v1/config", tags=["operators"])
_ERRORS = refusals(
    401,
    503,
    said={
        400: "A value the setting does not take",
        403: "Needs the role admin",
        404: "No such setting, or no live value to forget",
        409: "The setting is read at start-up: it needs a restart",
    },
)
Name = Annotated[str, Path(max_length=100, description="The setting's environment variable, e.g. OPENHUB_MAX_FAILS.")]


class NewValue(BaseModel):
    """A live setting's new value, as its environment variable would hold it."""

    model_config = ConfigDict(extra="forbid")
    value: str = Field(..., max_length=2000, json_schema_extra=NO_CONTROL)
    reason: str | None = Field(None, max_length=500, json_schema_extra=NO_CONTROL)


class Forget(BaseModel):
    """Why a live value is forgotten (kept in the audit trail)."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, max_length=500, json_schema_extra=NO_CONTROL)


@router.get("", summary="The settings in force, where each came from, on each process kind", responses=_ERRORS)
def show_config(_: Annotated[Caller, Depends(admin)], hub: ServedHub) -> dict[str, Any]:
    """`process`: this API process's settings (value, source: default, environment, code or store, whether
    live); `values`: the live values kept in the store; `processes`: the newest snapshot of each process kind
    (api, worker, beat) that loaded or changed its settings. Secrets are masked."""
    return settings.settings_in_force(hub=hub, kind="api")


@router.put("/{name}", summary="Change a live setting on every process, no restart", responses=_ERRORS)
def set_setting(name: Name, new: NewValue, _: Annotated[Caller, Depends(admin)], hub: ServedHub) -> dict[str, Any]:
    """Kept in the store; every process uses it within one poll interval (OPENHUB_POLL_INTERVAL)."""
    return settings.set_setting(name, new.value, new.reason, hub=hub)


@router.delete("/{name}", summary="Forget a live value: the environment's or the default applies", responses=_ERRORS)
def unset_setting(
    name: Name, _: Annotated[Caller, Depends(admin)], hub: ServedHub, forget: Forget | None = None
) -> dict[str, Any]:
    """Within one poll interval every process uses the environment's value, or the default, again."""
    return settings.unset_setting(name, forget.reason if forget else None, hub=hub)
