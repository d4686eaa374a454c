"""The hub the ingress app serves (`app.state.hub`, set by `create_app`), as a FastAPI dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from openhub.engine.hub import Hub


def served(request: Request) -> Hub:
    """The hub of the app answering `request`, its live settings refreshed (at most every half poll interval)."""
    hub: Hub = request.app.state.hub
    hub.refresh()
    return hub


ServedHub = Annotated[Hub, Depends(served)]
