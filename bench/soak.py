"""Soak under chaos: the promise (issue 9) checked over every route kind while faults are injected.

    PYTHONPATH=. .venv/bin/python bench/soak.py                      # 10,000 messages
    PYTHONPATH=. .venv/bin/python bench/soak.py --messages 1500 --minutes 8 --seed 1

Not a test, not run in CI. A private redis-server and a private PostgreSQL cluster, two
workers with beat, the routes of tests/support/routes.py (flow, entity, custom, split, funnel,
guaranteed order, wait-for-response answered here with openhub.respond, confirmations to
source system CONFIRMED). During --minutes it injects, seeded by --seed: SIGKILL of a worker
and a replacement (sometimes under the same name), PostgreSQL restart, Redis FLUSHALL, route
pause/resume, cancel then restart of messages, a slow confirmer. Then it waits (bounded by
--drain-minutes) until every message is final and checks:
  - every message final;
  - no external call succeeded twice per (path, idempotency key): each repeat is classed as
    "explained" when a kill / PostgreSQL restart / cancel happened between the first success's
    start and the repeat (the hub may not have learned the outcome; the key dedups it) or
    "unexplained" (a violation);
  - each final state confirmed once per (message, state) (same classing);
  - no funnel overlap (X-Funnel header).
Prints a summary and exits 1 on any violation; evidence goes to --out (default var/soak-<seed>).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openhub
from openhub.core.states import FINAL
from openhub.testing import ExternalSystem
from tests.support import backends
from tests.support.workers import Worker

P = "/soak"
KINDS = ["flow", "entity", "custom", "split", "funnel", "ordered", "wait"]
CONFIRM = f"{P}/confirm"


def payload(kind: str, i: int) -> tuple[str, dict]:
    if kind == "flow":
        return "test.flow", {"prefix": P}
    if kind == "entity":
        return "test.entity", {"prefix": P, "id": f"e{i}"}
    if kind == "custom":
        return "test.custom", {"prefix": P, "account": f"acc{i}"}
    if kind == "split":
        return "test.order", {"prefix": P, "lines": [{"sku": f"{i}-1"}, {"sku": f"{i}-2"}]}
    if kind == "funnel":
        g = f"f{i % 25}"
        return "test.funnel", {"prefix": P, "group": g, "funnel_header": g}
    if kind == "ordered":
        g = f"o{i % 25}"
        return "test.ordered", {"prefix": P, "group": g, "funnel_header": g}
    return "test.wait", {"prefix": P, "wait": 3600}


def quiet(fn, *a, **kw):
    """Call fn; a fault of ours (store restarting, broker flushed) only skips this attempt."""
    try:
        return fn(*a, **kw)
    except Exception as exc:
        return exc


def rows(sql: str, *params):
    from tests.support.process_store import transaction

    with transaction() as conn:
        return conn.exec_driver_sql(sql, params).all() if params else conn.exec_driver_sql(sql).all()


class Soak:
    def __init__(
        self,
        args: argparse.Namespace,
        backend: backends.Backend,
        pg: backends.PostgresServer,
        external: ExternalSystem,
        workdir: Path,
    ) -> None:
        self.args, self.b, self.pg, self.ext, self.workdir = args, backend, pg, external, workdir
        self.rng = random.Random(args.seed)
        self.faults: Counter = Counter()
        self.events: list[tuple[float, str, str]] = []  # (monotonic, kind, detail)
        self.workers = [Worker(backend.env, workdir / f"w{n}", beat=True, name=f"soak{n}").start() for n in (1, 2)]
        self.retired: list[Worker] = []
        self.ids: list[int] = []
        self.cancelled: set[int] = set()
        self.to_restart: list[tuple[float, int]] = []
        self.to_resume: list[tuple[float, str]] = []
        self.slow_until = 0.0

    def log(self, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        self.events.append((time.monotonic(), kind, detail))
        print(f"  [{time.strftime('%H:%M:%S')}] {kind} {detail}", flush=True)

    # --- faults -----------------------------------------------------------------------------
    def kill_worker(self) -> None:
        i = self.rng.randrange(len(self.workers))
        victim = self.workers[i]
        victim.kill()
        same = self.rng.random() < 0.5
        name = victim.name if same else f"soak{uuid.uuid4().hex[:4]}"
        self.retired.append(victim)
        self.log("kill", f"{victim.name} -> {'same name' if same else name}")
        self.workers[i] = Worker(
            self.b.env, self.workdir / f"w-{name}-{len(self.retired)}", beat=True, name=name
        ).start(timeout=120)

    def restart_pg(self) -> None:
        self.log("pg_restart")
        self.pg.pg_ctl("restart")

    def flush_redis(self) -> None:
        self.log("redis_flushall")
        assert self.b.redis is not None
        self.b.redis.client().flushall()

    def pause_route(self) -> None:
        route = payload(self.rng.choice(KINDS), 0)[0]
        if quiet(openhub.pause, route, "soak") is None:
            self.log("pause", route)
            self.to_resume.append((time.monotonic() + self.rng.uniform(3, 20), route))

    def cancel_some(self) -> None:
        found = quiet(
            rows,
            "SELECT id FROM messages WHERE state NOT IN ('OK','FAILED','CANCEL','SKIPPED') "
            "ORDER BY random() LIMIT %d" % self.rng.randint(1, 3),
        )
        live = [] if isinstance(found, Exception) else [i for (i,) in found]
        for i in live:
            if not isinstance(quiet(openhub.cancel, i), Exception):
                self.cancelled.add(i)
                self.log("cancel", str(i))
                if self.rng.random() < 0.7:
                    self.to_restart.append((time.monotonic() + self.rng.uniform(1, 10), i))

    def slow_confirmer(self) -> None:
        seconds = self.rng.uniform(10, 40)
        self.ext.delay(CONFIRM, 2.0)
        self.slow_until = time.monotonic() + seconds
        self.log("slow_confirmer", f"{seconds:.0f}s at 2 s per call")

    # --- upkeep -----------------------------------------------------------------------------
    def upkeep(self, final: bool = False) -> None:
        now = time.monotonic()
        for t, route in list(self.to_resume):
            if final or t <= now:
                if not isinstance(quiet(openhub.resume, route), Exception):
                    self.to_resume.remove((t, route))
                    self.events.append((now, "resume", route))
        for t, i in list(self.to_restart):
            if final or t <= now:
                r = quiet(openhub.restart, i)
                if not isinstance(r, openhub.StoreUnavailable):
                    self.to_restart.remove((t, i))
                    self.events.append((now, "restart", str(i)))
                    self.faults["restart"] += not isinstance(r, Exception)
        if self.slow_until and (final or now > self.slow_until):
            self.ext.delay(CONFIRM, 0)
            self.slow_until = 0.0
        waiting = quiet(rows, "SELECT id FROM messages WHERE state = 'WAITING_FOR_RES' LIMIT 200")
        if not isinstance(waiting, Exception):
            for (i,) in waiting:
                quiet(openhub.respond, i, {"answer": i})
        for w in self.workers:  # a worker that died by itself is replaced (and reported)
            if w.process is not None and w.process.poll() is not None:
                self.log("worker_exited_by_itself", f"{w.name} rc={w.process.returncode}")
                self.retired.append(w)
                workdir = self.workdir / f"w-{w.name}-r{len(self.retired)}"
                self.workers[self.workers.index(w)] = Worker(self.b.env, workdir, beat=True, name=w.name).start(
                    timeout=120
                )

    # --- run --------------------------------------------------------------------------------
    def run(self) -> dict:
        a = self.args
        start = time.monotonic()
        chaos_end = start + a.minutes * 60
        submit_end = start + a.minutes * 60 * 0.75
        batches = max(1, a.messages // 50)
        next_fault = start + self.rng.uniform(5, 15)
        faults = [
            (self.kill_worker, 3),
            (self.restart_pg, 1),
            (self.flush_redis, 1),
            (self.pause_route, 2),
            (self.cancel_some, 2),
            (self.slow_confirmer, 1),
        ]
        submitted = 0
        n = 0
        while time.monotonic() < chaos_end or submitted < a.messages:
            now = time.monotonic()
            share = min(1.0, (now - start) / (submit_end - start))
            due = min(a.messages, int(a.messages * share) + a.messages // batches)
            while submitted < due:
                items = []
                for _ in range(min(50, a.messages - submitted - len(items))):
                    kind = KINDS[n % len(KINDS)]
                    route, pl = payload(kind, n)
                    items.append(
                        {
                            "route": route,
                            "payload": pl,
                            "source_system": "CONFIRMED",
                            "correlation_id": f"soak-{a.seed}-{n}",
                        }
                    )
                    n += 1
                r = quiet(openhub.submit_many, items)
                if isinstance(r, Exception):
                    n -= len(items)  # same correlation ids next time: a resubmission is deduplicated
                    time.sleep(0.5)
                    break
                self.ids += [v.id for v in r]
                submitted += len(items)
            if now >= next_fault and now < chaos_end:
                fn = self.rng.choices([f for f, _ in faults], [w for _, w in faults])[0]
                try:
                    fn()
                except Exception as exc:
                    print(f"  fault {fn.__name__} raised {exc!r}", flush=True)
                next_fault = time.monotonic() + self.rng.uniform(a.fault_every * 0.5, a.fault_every * 1.5)
            self.upkeep()
            time.sleep(0.5)
        chaos_seconds = time.monotonic() - start
        print(f"chaos over after {chaos_seconds:.0f} s ({len(set(self.ids))} messages submitted); draining", flush=True)
        deadline = time.monotonic() + a.drain_minutes * 60
        left = None
        while time.monotonic() < deadline:
            self.upkeep(final=True)
            r = quiet(rows, "SELECT count(*) FROM messages WHERE state NOT IN ('OK','FAILED','CANCEL','SKIPPED')")
            if not isinstance(r, Exception):
                left = r[0][0]
                c = quiet(rows, "SELECT count(*) FROM confirmations WHERE state IN ('PENDING','SENDING')")
                pending = c[0][0] if not isinstance(c, Exception) else 1
                if left == 0 and pending == 0 and not self.to_restart:
                    break
            time.sleep(2)
        time.sleep(3)  # last confirmations
        return {"chaos_seconds": chaos_seconds, "total_seconds": time.monotonic() - start}


def classify(calls: list, events: list[tuple[float, str, str]]) -> tuple[list, list]:
    """Repeats of a successful (path, key): (explained by a fault in between, unexplained)."""
    by_key: dict[tuple[str, str], list] = defaultdict(list)
    for c in calls:
        if c.status < 400 and c.key is not None:
            by_key[(c.path, c.key)].append(c)
    explained, unexplained = [], []
    for (path, key), cs in by_key.items():
        cs.sort(key=lambda c: c.started)
        for first, again in zip(cs, cs[1:]):
            causes = [
                (k, d)
                for t, k, d in events
                if first.started <= t <= again.started
                and k in ("kill", "pg_restart", "cancel", "restart", "worker_exited_by_itself")
            ]
            # "during": a fault while the first call was under way or within 2 s after it (before
            # its outcome could be recorded): the tight explanation; otherwise the window is loose.
            during = any(
                first.started <= t <= first.ended + 2
                for t, k, _ in events
                if k in ("kill", "pg_restart", "worker_exited_by_itself")
            )
            (explained if causes else unexplained).append(
                (path, key, first.started, first.ended, again.started, during, causes[:3])
            )
    return explained, unexplained


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--minutes", type=float, default=30, help="how long faults are injected (submission: first 3/4)")
    p.add_argument("--drain-minutes", type=float, default=15, help="bound on the wait for every message to be final")
    p.add_argument("--fault-every", type=float, default=20, help="mean seconds between faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    out = a.out or Path("var") / f"soak-{a.seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    external = ExternalSystem().start()
    pg = backends.PostgresServer.start()
    soak = None
    violations: list[str] = []
    try:
        with backends.backend(
            "redis-pg", out / "hub", {"OPENHUB_TEST_EXTERNAL_URL": external.url}, pg_server=pg.url
        ) as b:
            soak = Soak(a, b, pg, external, out)
            try:
                times = soak.run()
            finally:
                for w in soak.workers:
                    w.stop()
            ids = sorted(set(soak.ids))
            states = Counter()
            not_final = []
            for i, s in rows("SELECT id, state FROM messages"):
                states[s] += 1
                if s not in {str(f) for f in FINAL}:
                    not_final.append((i, s))
            kinds = Counter(f"{s}.{o}" for (s, o) in rows("SELECT service, operation FROM messages"))
            ok_calls = [c for c in external.calls if c.path != CONFIRM]
            confirms = [c for c in external.calls if c.path == CONFIRM]
            ex_calls, bad_calls = classify(ok_calls, soak.events)
            ex_conf, bad_conf = classify(confirms, soak.events)
            overlaps = list(external.overlaps)
            failed = rows("SELECT id, service, operation, failed_step, failed_error FROM messages WHERE state='FAILED'")
            evidence = {
                "not_final": not_final,
                "unexplained_repeats": bad_calls,
                "unexplained_confirm_repeats": bad_conf,
                "explained_repeats": ex_calls,
                "explained_confirm_repeats": ex_conf,
                "overlaps": overlaps,
                "failed": [list(map(str, r)) for r in failed],
                "events": soak.events,
            }
            for key in ("not_final", "unexplained_repeats", "unexplained_confirm_repeats"):
                for item in evidence[key][:20]:
                    mid = item[0] if key == "not_final" else None
                    if key != "not_final":
                        k = item[1]
                        try:
                            mid = (
                                int(str(k).split(":")[0])
                                if key.startswith("unexplained_confirm")
                                else rows('SELECT message_id FROM ext_calls WHERE "key" = %s LIMIT 1', k)[0][0]
                            )
                        except Exception:
                            mid = None
                    if mid is not None:
                        evidence.setdefault("histories", {})[str(mid)] = [
                            list(map(str, r))
                            for r in quiet(rows, f"SELECT * FROM transitions WHERE message_id = {int(mid)} ORDER BY id")
                            or []
                        ]
            (out / "evidence.json").write_text(json.dumps(evidence, indent=1, default=str))
            if len(ids) != a.messages:
                violations.append(f"submitted {len(ids)} ids for {a.messages} messages")
            if not_final:
                violations.append(f"{len(not_final)} messages not final: {not_final[:10]}")
            if bad_calls:
                violations.append(f"{len(bad_calls)} unexplained repeats of successful calls: {bad_calls[:5]}")
            if bad_conf:
                violations.append(f"{len(bad_conf)} unexplained duplicate confirmations: {bad_conf[:5]}")
            if overlaps:
                violations.append(f"{len(overlaps)} funnel overlaps: {overlaps[:10]}")
            print("\n=== soak summary (seed %d) ===" % a.seed)
            print(f"messages submitted     {len(ids)} (+ children: {sum(kinds.values()) - len(ids)} rows more)")
            print(f"routes                 {dict(kinds)}")
            print(f"final states           {dict(states)}")
            print(f"faults injected        {dict(soak.faults)}")
            print(
                f"external calls         {len(ok_calls)} (2xx: {sum(c.status < 400 for c in ok_calls)}), "
                f"effects {len({(c.path, c.key) for c in ok_calls if c.status < 400})}"
            )
            print(
                f"repeats of a success   explained by a fault between them: {len(ex_calls)} "
                f"(a kill/restart during the first call: {sum(e[5] for e in ex_calls)}); "
                f"unexplained: {len(bad_calls)}"
            )
            print(
                f"confirmations          {len(confirms)} calls; duplicates explained {len(ex_conf)} "
                f"(during the first: {sum(e[5] for e in ex_conf)}), unexplained {len(bad_conf)}"
            )
            print(f"funnel overlaps        {len(overlaps)}")
            print(f"time                   chaos {times['chaos_seconds']:.0f} s, total {times['total_seconds']:.0f} s")
            print(f"evidence               {out / 'evidence.json'}")
            for v in violations:
                print("VIOLATION:", v)
    finally:
        pg.remove()
        external.stop()
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
