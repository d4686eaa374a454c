"""Statements a batch route costs the store, by kind (issue 42): LocalHub on PostgreSQL carries `--messages`
messages of `batched.flow` (tests/support/routes.py: 3 steps, batches of up to 20) to their end, and every
statement it sends while doing so (the submit not included) is counted, by its first words.

    PYTHONPATH=. .venv/bin/python bench/batch_statements.py [--messages 20] [--route batched.flow]

Exact and independent of the machine's load: compare two checkouts by running it from each.
"""

from __future__ import annotations

import argparse
import os
import re
import uuid
from collections import Counter

from sqlalchemy import event


def kind(statement: str) -> str:
    """A statement's first words: its verb and table, CTEs named."""
    sql = " ".join(statement.split())
    ctes = re.findall(r"(?:WITH|,)\s+(\w+) AS \(", sql)
    verb = re.sub(r"^WITH .*?\)\s*(SELECT|UPDATE|INSERT|DELETE)", r"\1", sql) if ctes else sql
    words = re.match(r"(SELECT|UPDATE|INSERT INTO|DELETE FROM|BEGIN|COMMIT|SAVEPOINT|RELEASE SAVEPOINT)\s*(\S*)", verb)
    head = " ".join(w for w in words.groups() if w) if words else sql[:40]
    if head.startswith("SELECT"):
        table = re.search(r"\bFROM (\w+)", verb)
        head = f"SELECT {table.group(1) if table else ''}".strip()
    return head + (f" (with {', '.join(ctes)})" if ctes else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--route", default="batched.flow")
    args = parser.parse_args()

    from openhub.store import db
    from openhub.store.migrate import upgrade
    from openhub.testing import ExternalSystem, LocalHub
    from tests.support import backends

    external = ExternalSystem().start()
    os.environ["OPENHUB_TEST_EXTERNAL_URL"] = external.url
    kinds: Counter[str] = Counter()
    with backends.postgres_database("openhub_batch_statements") as url:
        upgrade(url)
        with LocalHub("tests.support.routes", OPENHUB_DATABASE_URL=url) as local:
            prefix = f"/s{uuid.uuid4().hex[:8]}"
            ids = [local.submit(args.route, {"prefix": prefix, "n": n}).id for n in range(args.messages)]
            counting = [True]

            def counted(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
                if counting[0]:
                    kinds[kind(statement)] += 1

            event.listen(db.get_engine(url), "before_cursor_execute", counted)
            local.run()
            counting[0] = False
            states = Counter(local.get(i).state for i in ids)
    external.stop()
    total = sum(kinds.values())
    print(
        f"{args.messages} messages of {args.route}: {dict(states)}; {total} statements, "
        f"{total / args.messages:.2f} per message"
    )
    for name, n in kinds.most_common():
        print(f"{n:6d}  {name}")


if __name__ == "__main__":
    main()
