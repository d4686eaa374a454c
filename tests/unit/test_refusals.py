"""The refusals the OpenAPI document lists for each endpoint are said in one place (openhub.api.problems):
an endpoint names its statuses, and gives its own words only where they say more than the common ones."""

from __future__ import annotations

import re
from pathlib import Path

from openhub.api import problems
from openhub.api.problems import REFUSALS, refusals

API = Path(problems.__file__).parent


def test_an_endpoints_own_words_replace_the_common_ones_in_status_order() -> None:
    documented = refusals(503, 401, said={404: "No such worker", 401: "Missing or invalid API key"})
    assert list(documented) == [401, 404, 503]
    assert documented[401] == {"description": "Missing or invalid API key"}
    assert documented[404] == {"description": "No such worker"}
    assert documented[503] == {"description": REFUSALS[503]}


def test_no_router_describes_a_refusal_by_hand() -> None:
    by_hand = re.compile(r"\b[45]\d\d\s*:\s*\{\s*\"description\"|\{\s*\"description\"\s*:\s*d\s*\}")
    found = [
        path.name
        for path in sorted(API.glob("*.py"))
        if path.name != "problems.py" and by_hand.search(path.read_text())
    ]
    assert found == []
