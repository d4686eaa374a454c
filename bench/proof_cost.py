"""What the proof before each call costs (openhub.store.proof, issue 33 break 6): pings per external call
and statements per call, for chain and batch routes whose calls take 200 ms, on PostgreSQL, in a process
that heartbeats as a worker's does (the proof applies to worker processes only).

    PYTHONPATH=. .venv/bin/python bench/proof_cost.py [--gevent] [--messages 40] [--pause 0]

`--pause S`: each step computes S seconds between its lease and its call (a step slower than PROOF_AGE to
reach its call pays a ping, unless another statement of its process proved the store meanwhile).
"""

from __future__ import annotations

import sys

if "--gevent" in sys.argv:
    from gevent import monkey  # type: ignore[import-untyped]

    monkey.patch_all()

import argparse
import os
import uuid

from sqlalchemy import event


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gevent", action="store_true")
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()

    from openhub.store import db, proof, workers
    from openhub.store.migrate import upgrade
    from openhub.testing import ExternalSystem, LocalHub
    from tests.support import backends

    external = ExternalSystem().start()
    os.environ["OPENHUB_TEST_EXTERNAL_URL"] = external.url
    rows = []
    with backends.postgres_database("openhub_proof") as url:
        upgrade(url)
        os.environ["OPENHUB_DATABASE_URL"] = url
        with LocalHub("tests.support.routes", OPENHUB_DATABASE_URL=url) as local:
            workers.start_heartbeat(local.hub.settings)  # as a worker's process: its calls are fenced, and proven
            statements = [0]

            def counted(*_args: object) -> None:
                statements[0] += 1

            event.listen(db.get_engine(url), "after_cursor_execute", counted)
            for route in ("test.flow", "batched.flow"):
                prefix = f"/c{uuid.uuid4().hex[:8]}"
                for name in "abc":
                    external.delay(f"{prefix}/{name}", 0.2)
                script = {name: {"pause": args.pause} for name in "abc"} if args.pause else {}
                pings, before, calls = proof.pings_made(), statements[0], external.count()
                for n in range(args.messages):
                    local.submit(route, {"prefix": prefix, "n": n, "script": script})
                local.run()
                made = external.count() - calls
                rows.append(
                    (
                        route,
                        made,
                        proof.pings_made() - pings,
                        round((proof.pings_made() - pings) / max(made, 1), 3),
                        round((statements[0] - before) / max(made, 1), 1),
                    )
                )
            workers.stop_heartbeat()
    external.stop()
    pool = "gevent" if args.gevent else "one at a time"
    print(f"| route ({pool}, pause {args.pause} s) | calls | pings | pings per call | statements per call |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
