"""A Jepsen-style checker over the external system's own log (issue 22).

It reads what the external systems saw (openhub.testing.ExternalSystem's calls: path, idempotency
key, status, when, from which host), what the fault driver did and when, what was submitted, and
the messages' final states, and says what broke the promise:

- a successful call repeated (same path and key), unless the first one was in flight on a host
  when a fault that stops its worker's record hit that host (a kill, a stall, a cut from
  PostgreSQL): then it is listed as explained;
- a message not final; a step of a message that ended OK never applied;
- a final message's confirmation not made exactly once (its key `<id>:<state>`), or made for a state
  the message is not in;
- two calls of one funnel in flight at once;
- a funnel in guaranteed order whose calls were applied out of submission order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

# Faults that stop a worker between its call and its record: a call in flight then is made again
# by the repair, with the same key, and the external system answers it as a replay.
EXPLAINS = {"kill", "stall", "cut_pg", "cut_both"}
SLACK = 2.0  # seconds after a call's answer in which its record may still have been under way
STEPS = {"test.flow": ["a", "b", "c"], "fused.flow": ["a", "b", "c"], "test.funnel": ["ordered"],
         "test.ordered_x": ["ordered"]}


@dataclass
class Report:
    """What the checker found."""

    messages: int = 0
    states: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    repeated: list[dict[str, Any]] = field(default_factory=list)  # unexplained: a broken promise
    explained: list[dict[str, Any]] = field(default_factory=list)
    not_final: list[int] = field(default_factory=list)
    missing_calls: list[str] = field(default_factory=list)
    confirmations: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.repeated or self.not_final or self.missing_calls or self.confirmations or self.overlaps
                    or self.out_of_order)

    def summary(self) -> dict[str, Any]:
        return {"messages": self.messages, "states": self.states, "calls": self.calls,
                "repeated_unexplained": len(self.repeated), "repeated_explained": len(self.explained),
                "not_final": len(self.not_final), "missing_calls": len(self.missing_calls),
                "confirmation_faults": len(self.confirmations), "funnel_overlaps": len(self.overlaps),
                "out_of_order": len(self.out_of_order), "ok": self.ok}

    def details(self, limit: int = 20) -> dict[str, Any]:
        return {k: getattr(self, k)[:limit] for k in ("repeated", "explained", "not_final", "missing_calls",
                                                       "confirmations", "overlaps", "out_of_order")}


def check(calls: Iterable[Any], overlaps: list[str], faults: list[Any], host_of: Any,
          submitted: dict[str, dict[str, Any]], states: dict[int, str], final: set[str], origin: float) -> Report:
    """Check the log. `calls`: the external system's; `faults`: the driver's (kind, host, start, end);
    `host_of(address)`: a caller's host name; `submitted`: correlation id -> {id, route, group, prefix};
    `states`: message id -> state; `origin`: the monotonic time the run started (for the report)."""
    report = Report(messages=len(submitted))
    for s in states.values():
        report.states[s] = report.states.get(s, 0) + 1
    ok_calls: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for c in calls:
        report.calls += 1
        if c.status < 400 and c.key is not None:
            ok_calls[(c.path, c.key)].append(c)
    for (path, key), made in ok_calls.items():
        if len(made) < 2:
            continue
        made.sort(key=lambda c: c.started)
        first = made[0]
        host = host_of(first.peer)
        cause = next((f for f in faults if f.kind in EXPLAINS and f.host == host
                      and f.start <= first.ended + SLACK and (f.end is None or f.end >= first.started)), None)
        entry = {"path": path, "key": key, "times": len(made), "hosts": [host_of(c.peer) for c in made],
                 "at": [round(c.started - origin, 1) for c in made]}
        if cause is not None:
            report.explained.append(dict(entry, fault=cause.as_dict(origin)))
        else:
            report.repeated.append(entry)
    by_id = {v["id"]: (corr, v) for corr, v in submitted.items()}
    for mid, (corr, v) in sorted(by_id.items()):
        state = states.get(mid)
        if state not in final:
            report.not_final.append(mid)
            continue
        if state == "OK":
            for step in STEPS.get(v["route"], []):
                if not ok_calls.get((f"{v['prefix']}/{step}", f"CONFIRMED/{corr}/{step}")):
                    report.missing_calls.append(f"{mid} {v['route']} {step}")
        for s in final:
            n = len(ok_calls.get((f"{v['prefix']}/confirm", f"{mid}:{s}"), []))
            if s == state and n == 0:
                report.confirmations.append(f"{mid} {state}: never confirmed")
            elif s != state and n:
                report.confirmations.append(f"{mid} is {state} but was confirmed {s}")
    report.overlaps = sorted(set(overlaps))
    ids = {corr: v["id"] for corr, v in submitted.items()}
    firsts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for (path, key), made in ok_calls.items():
        if path == "/ordered/ordered":
            corr = key.split("/")[1]
            group = submitted.get(corr, {}).get("group")
            if group is not None:
                firsts[group].append((min(c.started for c in made), ids[corr]))
    for group, seq in firsts.items():
        order = [mid for _t, mid in sorted(seq)]
        for before, after in zip(order, order[1:]):
            if after < before:
                report.out_of_order.append(f"{group}: {after} called after {before}")
    return report
