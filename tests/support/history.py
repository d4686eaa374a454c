"""A Jepsen-style checker over the external system's own log (issues 22 and 33).

It reads what the external systems saw (openhub.testing.ExternalSystem's calls: path, idempotency
key, status, when, from which host and which process), what the fault driver did and when (to which
host, and to which processes), what was submitted, and the messages' final states, and says what broke
the promise:

- a call made again (same path and key, answered OK), unless the call it repeats was in flight, from
  the very process that made it, at the moment a fault that stops that process's record hit that
  process or its host: a kill or a stall of that process (its pid in the fault's), or a cut of its
  host from PostgreSQL (a call arriving within CUT_UNSEEN of the cut counts as in flight then: a
  process sends a call only within PROOF_AGE of its store's last answer). Anything else is unexplained:
  a repeat whose first call started after the fault began (later than that after a cut), a repeat
  during a fault on another host, a repeat whose first call was made by a process other than the
  stalled one, a call made again before the fault. A batch route's call is in flight until its batch's
  calls of that step in that process have ended (its record is written with theirs: BATCH_ROUTES); a call's
  record is under way up to SLACK after that, plus its process's lag (a process slow to send is slow to
  record: LAG_WINDOW). A confirmation sent twice is never explained by a cut (its sending lease is in the
  store, not in the worker's heartbeat), only by its own process killed or stalled while sending;
- a message not final; a step of a message that ended OK never applied (a split's children: every
  line applied);
- a final message's confirmation not made exactly once (its key `<id>:<state>`), or made for a state
  the message is not in;
- two calls of one funnel being answered at once, judged from the calls' own times (the stub holds a
  funnel's calls for a while so that an overlap can be seen), and what the stub itself saw;
- a funnel in guaranteed order whose calls arrived out of submission order, judged on every arrival
  (A, B, then a late A is out of order, whatever the late A's key).

A call says which process made it in `X-Test-Pid`, and when its step's body began in `X-Test-Began`
(tests/support/routes.py); a call without a pid is never explained by a fault on a process, one without
the time is taken to have begun when it arrived.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from math import inf
from typing import Any, Iterable

# Faults that stop a worker between its call and its record: a call in flight then is made again
# by the repair, with the same key, and the external system answers it as a replay.
EXPLAINS = {"kill", "stall", "cut_pg", "cut_both"}
# A confirmation's sending lease lives in the store: only its sender's death or stall can send it twice.
EXPLAINS_CONFIRMATION = {"kill", "stall"}
SLACK = 2.0  # seconds after a call's answer in which its record may still have been under way
# A process slow to act (CPU-starved on a busy box, in line for a store connection behind its greenlets) is as slow
# to write a record as to send a call: a call's record may come SLACK plus its process's lag later, the lag being
# the longest any of that process's steps took from its body's beginning to its call's arrival, among those that
# began within LAG_WINDOW of the call's answer (on a quiet box milliseconds; a CI run at load 15 saw 3.1 s).
LAG_WINDOW = 5.0
# How long after its host's store cut a call may still be sent, as if it had been in flight when the cut came:
# a worker process sends a call only within PROOF_AGE (0.5 s, openhub.store.proof) of a round trip of its own
# to the store, which must have been sent before the cut, plus 0.25 s for the fault driver's clock reading
# before its nft rules were in place and the call's way to the stub (issue 33, break 6). A call arriving
# later is a call started once the store was lost: unexplained (its entry is marked `after_cut`).
CUT_UNSEEN = 0.75
# How long after a kill's or a stall's recorded start a call of its process may still arrive as one in flight
# then: the driver reads its clock before it signals the host's processes one after another, and the call may
# already be on its way to the stub (a soak on a box at load 10 saw one arrive 0.12 s after a kill; a CI run at
# load 15, 0.05 s after a stall). A killed process sends nothing afterwards; a stalled one sends on resume,
# after the stall's end: a call arriving then is not the stall's.
SIGNAL_UNSEEN = 0.5
# route -> its steps' calls: (the path after the message's prefix, the step's key)
STEPS = {
    "test.flow": [("a", "a"), ("b", "b"), ("c", "c")],
    "fused.flow": [("a", "a"), ("b", "b"), ("c", "c")],
    "batched.flow": [("a", "a"), ("b", "b"), ("c", "c")],
    "test.funnel": [("ordered", "ordered")],
    "test.ordered_x": [("ordered", "ordered")],
    "test.order": [("a", "a"), ("after", "after_lines")],
}
GUARANTEED_ORDER = {"test.ordered_x", "test.ordered"}
# Batch routes (`Route(batch=N)`): one task carries its messages through each step in lockstep, and records
# every member's step in ONE transaction after the last member's call of that step (prefork: one after
# another; gevent: side by side). A member's call is in flight, for a fault, until its siblings' calls end:
# the calls of the same step made by the same process for messages published together (`group`: the
# traffic's request), each starting within LOCKSTEP_GAP of the run so far.
BATCH_ROUTES = {"batched.flow"}
LOCKSTEP_GAP = 1.0
PID_HEADER = "x-test-pid"
BEGAN_HEADER = "x-test-began"
FUNNEL_HEADER = "x-funnel"


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
        return not (
            self.repeated
            or self.not_final
            or self.missing_calls
            or self.confirmations
            or self.overlaps
            or self.out_of_order
        )

    def summary(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "states": self.states,
            "calls": self.calls,
            "repeated_unexplained": len(self.repeated),
            "repeated_explained": len(self.explained),
            "not_final": len(self.not_final),
            "missing_calls": len(self.missing_calls),
            "confirmation_faults": len(self.confirmations),
            "funnel_overlaps": len(self.overlaps),
            "out_of_order": len(self.out_of_order),
            "ok": self.ok,
        }

    def details(self, limit: int = 20) -> dict[str, Any]:
        return {
            k: getattr(self, k)[:limit]
            for k in (
                "repeated",
                "explained",
                "not_final",
                "missing_calls",
                "confirmations",
                "overlaps",
                "out_of_order",
            )
        }


def pid_of(call: Any) -> int | None:
    """The process that made `call` (its X-Test-Pid), or None."""
    value = (getattr(call, "headers", None) or {}).get(PID_HEADER)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def began_of(call: Any) -> float:
    """When the step that made `call` began its body (its X-Test-Began, on the machine's monotonic clock,
    which every host of the rig shares), or, without one, when the call arrived."""
    value = (getattr(call, "headers", None) or {}).get(BEGAN_HEADER)
    arrived = float(call.started)
    try:
        return min(float(value), arrived) if value is not None else arrived
    except ValueError:
        return arrived


def hit(fault: Any, call: Any, host: str | None, kinds: set[str], until: float | None = None) -> bool:
    """Whether `fault` stopped the record of `call`: a fault of one of `kinds` on the call's own host that began
    while the call was in flight, up to SLACK after its answer. A kill or a stall must have hit the process
    that made the call (its pid among the fault's) after the call arrived, or at most SIGNAL_UNSEEN before:
    a process stopped before it sent its call sends it on resume, after the stall, which nothing explains. A
    cut from the store must have come after the step's body began (a step cannot begin without its lease
    written), or the call must have arrived within CUT_UNSEEN of it: nothing tells a process its store is cut
    until a statement goes unanswered, and a call is sent within PROOF_AGE of the last one answered, so it may
    arrive just after the cut began, as if in flight then; a call arriving later (started once the store was
    lost, issue 33 break 6) is not explained. `until`: when the call's record could begin, if later than its
    answer (a batch member's: when its siblings' calls ended, `lockstep_ends`; a slow process's: later by its
    lag, `process_lags`)."""
    if fault.kind not in kinds or host is None or fault.host != host:
        return False
    ended = max(call.ended, until or call.ended)
    process = fault.kind in ("kill", "stall")
    if process and not call.started - SIGNAL_UNSEEN <= fault.start <= ended + SLACK:
        return False
    if fault.kind == "stall" and fault.end is not None and call.started >= fault.end:
        return False  # sent on resume
    if not process and not (min(began_of(call), call.started - CUT_UNSEEN) <= fault.start <= ended + SLACK):
        return False
    pids = getattr(fault, "pids", None)
    if process:
        return pids is not None and pid_of(call) in pids
    return True


def lockstep_ends(calls: Iterable[Any], submitted: dict[str, dict[str, Any]]) -> dict[int, float]:
    """For each step call of a batch route's message (by `id(call)`): when the run of that step ended in its
    process, the last answer among its siblings' calls (BATCH_ROUTES), after which its record is written."""
    runs: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for c in calls:
        parts = (c.key or "").split("/")
        v = submitted.get(parts[1]) if len(parts) >= 3 else None
        pid = pid_of(c)
        if v is None or v["route"] not in BATCH_ROUTES or pid is None or c.path != f"{v['prefix']}/{parts[2]}":
            continue
        runs[(pid, c.path, v.get("group"))].append(c)
    ends: dict[int, float] = {}
    for seq in runs.values():
        seq.sort(key=lambda c: c.started)
        run: list[Any] = []
        end = float("-inf")
        for c in seq + [None]:
            if c is None or (run and c.started > end + LOCKSTEP_GAP):
                ends.update((id(m), end) for m in run)
                run, end = [], float("-inf")
            if c is not None:
                run.append(c)
                end = max(end, c.ended)
    return ends


def process_lags(calls: Iterable[Any], faults: list[Any], host_of: Any) -> dict[int, float]:
    """For each call with a pid (by `id(call)`): its process's lag about its answer (LAG_WINDOW), from the steps of
    that process no fault on its host overlapped (a stalled step's call arrives on resume: a fault, not a lag)."""
    calls = list(calls)
    by_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        pid, host, began = pid_of(c), host_of(c.peer), began_of(c)
        if pid is not None and not any(
            f.host == host and f.start <= c.started and (f.end is None or began <= f.end) for f in faults
        ):
            by_pid[pid].append((began, float(c.started) - began))
    for steps in by_pid.values():
        steps.sort()
    lags: dict[int, float] = {}
    for c in calls:
        pid = pid_of(c)
        steps = by_pid.get(pid, []) if pid is not None else []
        near = steps[bisect_left(steps, (c.ended - LAG_WINDOW,)) : bisect_right(steps, (c.ended + LAG_WINDOW, inf))]
        lags[id(c)] = max((lag for _, lag in near), default=0.0)
    return lags


def _repeats(
    path: str,
    key: str,
    made: list[Any],
    faults: list[Any],
    host_of: Any,
    origin: float,
    ends: dict[int, float] | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """The entry for a call made more than once, and for each repeat the fault that explains it (None:
    unexplained). A repeat is explained by an earlier call of the same key that a fault hit in flight
    (a batch member's until its siblings' calls ended: `ends`, from `lockstep_ends`), the fault having
    begun before the repeat arrived."""
    ends = ends or {}
    kinds = EXPLAINS_CONFIRMATION if path.endswith("/confirm") else EXPLAINS
    causes: list[Any] = []
    for i, again in enumerate(made[1:], start=1):
        cause = next(
            (
                f
                for earlier in made[:i]
                for f in faults
                if f.start <= again.started and hit(f, earlier, host_of(earlier.peer), kinds, ends.get(id(earlier)))
            ),
            None,
        )
        causes.append(cause)
    entry = {
        "path": path,
        "key": key,
        "times": len(made),
        "hosts": [host_of(c.peer) for c in made],
        "pids": [pid_of(c) for c in made],
        "at": [round(c.started - origin, 3) for c in made],
        "began": [round(began_of(c) - origin, 3) for c in made],
        # until when a fault could still stop each call's record (its answer, its batch's, its process's lag, SLACK)
        "record_by": [round(ends.get(id(c), c.ended) + SLACK - origin, 3) for c in made],
    }
    first = made[0]
    cut = next(
        (
            f
            for f in faults
            if f.kind in ("cut_pg", "cut_both")
            and f.host == host_of(first.peer)
            and f.start + CUT_UNSEEN < first.started
            and (getattr(f, "end", None) is None or f.start < began_of(first) <= f.end)
        ),
        None,
    )
    if cut is not None:
        entry["after_cut"] = round(first.started - cut.start, 3)  # its first call arrived this long after the cut
    return entry, causes


def funnel_overlaps(calls: Iterable[Any], origin: float) -> list[str]:
    """Calls of one funnel (X-Funnel) being answered at the same time, from the calls' own times."""
    by_funnel: dict[str, list[Any]] = defaultdict(list)
    for c in calls:
        funnel = (getattr(c, "headers", None) or {}).get(FUNNEL_HEADER)
        if funnel:
            by_funnel[funnel].append(c)
    found = []
    for funnel, made in by_funnel.items():
        made.sort(key=lambda c: c.started)
        latest = made[0]
        for c in made[1:]:
            if c.started < latest.ended:
                found.append(
                    f"{funnel}: {c.key} arrived at {c.started - origin:.2f} while {latest.key} was "
                    f"answered until {latest.ended - origin:.2f}"
                )
            if c.ended > latest.ended:
                latest = c
    return found


def check(
    calls: Iterable[Any],
    overlaps: list[str],
    faults: list[Any],
    host_of: Any,
    submitted: dict[str, dict[str, Any]],
    states: dict[int, str],
    final: set[str],
    origin: float,
) -> Report:
    """Check the log. `calls`: the external system's; `overlaps`: the funnels it saw overlap; `faults`: the
    driver's (kind, host, pids or None for the whole host, start, end); `host_of(address)`: a caller's host
    name; `submitted`: correlation id -> {id, route, group (a batch route's: the messages published with
    it), prefix, lines?}; `states`: message id -> state;
    `origin`: the monotonic time the run started (for the report)."""
    calls = list(calls)
    report = Report(messages=len(submitted))
    for s in states.values():
        report.states[s] = report.states.get(s, 0) + 1
    ok_calls: dict[tuple[str, str], list[Any]] = defaultdict(list)
    # when each call's record could begin (a batch member's: once its siblings' calls ended), later by its process's lag
    lockstep, lags = lockstep_ends(calls, submitted), process_lags(calls, faults, host_of)
    ends = {id(c): max(c.ended, lockstep.get(id(c), c.ended)) + lags.get(id(c), 0.0) for c in calls}
    for c in calls:
        report.calls += 1
        if c.status < 400 and c.key is not None:
            ok_calls[(c.path, c.key)].append(c)
    for (path, key), made in ok_calls.items():
        if len(made) < 2:
            continue
        made.sort(key=lambda c: c.started)
        entry, causes = _repeats(path, key, made, faults, host_of, origin, ends)
        if all(cause is not None for cause in causes):
            report.explained.append(dict(entry, faults=[cause.as_dict(origin) for cause in causes]))
        else:
            report.repeated.append(dict(entry, unexplained=[i + 1 for i, cause in enumerate(causes) if cause is None]))
    by_id = {v["id"]: (corr, v) for corr, v in submitted.items()}
    keys_on: dict[str, set[str]] = defaultdict(set)
    for path, key in ok_calls:
        keys_on[path].add(key)
    for mid, (corr, v) in sorted(by_id.items()):
        state = states.get(mid)
        if state not in final:
            report.not_final.append(mid)
            continue
        if state == "OK":
            for step, key in STEPS.get(v["route"], []):
                if not ok_calls.get((f"{v['prefix']}/{step}", f"CONFIRMED/{corr}/{key}")):
                    report.missing_calls.append(f"{mid} {v['route']} {step}")
            lines = len(keys_on[v["prefix"] + "/line"])
            if v.get("lines") is not None and lines != v["lines"]:
                report.missing_calls.append(f"{mid} {v['route']}: {lines} of {v['lines']} lines applied")
        for s in final:
            n = len(ok_calls.get((f"{v['prefix']}/confirm", f"{mid}:{s}"), []))
            if s == state and n == 0:
                report.confirmations.append(f"{mid} {state}: never confirmed")
            elif s != state and n:
                report.confirmations.append(f"{mid} is {state} but was confirmed {s}")
    report.overlaps = sorted(set(overlaps)) + funnel_overlaps(calls, origin)
    report.out_of_order = out_of_order(calls, submitted, origin)
    return report


def out_of_order(calls: Iterable[Any], submitted: dict[str, dict[str, Any]], origin: float) -> list[str]:
    """Every arrival of a guaranteed-order funnel's call after an arrival of a later-submitted message."""
    arrivals: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for c in calls:
        parts = (c.key or "").split("/")
        v = submitted.get(parts[1]) if len(parts) >= 3 else None
        if v is None or v["route"] not in GUARANTEED_ORDER or v.get("group") is None:
            continue
        if c.path != f"{v['prefix']}/{parts[2]}":
            continue
        arrivals[v["group"]].append((c.started, v["id"], c.key))
    found = []
    for group, seq in arrivals.items():
        seq.sort()
        latest: tuple[float, int, str] | None = None  # the arrival of the latest-submitted message so far
        for at, mid, key in seq:
            if latest is not None and mid < latest[1]:
                found.append(
                    f"{group}: {mid} ({key}) arrived at {at - origin:.2f}, after {latest[1]} "
                    f"({latest[2]}) at {latest[0] - origin:.2f}"
                )
            if latest is None or mid > latest[1]:
                latest = (at, mid, key)
    return found
