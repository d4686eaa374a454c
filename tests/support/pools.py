"""The Celery pools the fault and pattern suites run on (README.md, "Which worker pool").

`ON_EVERY_POOL` runs a test that uses the session's worker (the `hub` fixture) once on prefork and
once on gevent; `POOL_OPTIONS` is how a test's own workers are started on a pool: gevent with many
greenlets, as it is run for slow external systems.
"""

from __future__ import annotations

import pytest

POOLS = ["prefork", "gevent"]
POOL_OPTIONS: dict[str, dict] = {"prefork": {"concurrency": 2}, "gevent": {"pool": "gevent", "concurrency": 50}}

# prefork is the session fixture `pool` without a parameter (None), so tests on prefork only and the
# prefork half of these share one worker instead of restarting it between them.
ON_EVERY_POOL = pytest.mark.parametrize("pool", [None, "gevent"], ids=POOLS, indirect=True, scope="session")
