"""Top functions of a py-spy profile in collapsed form (`py-spy record --format raw`).

    python bench/collapsed.py PROFILE.txt [--top 30] [--ms 12.5]   # the process's CPU ms per message

Each line of the file is `frame;frame;...;leaf COUNT`, a frame `function (file:line)`. Prints the
functions by self samples (where the CPU was) and by inclusive samples (what it was spent under,
each stack counted once per function), as shares of all samples; with --ms (the profiled
processes' CPU per message, from /proc), also each share of it. py-spy counts a thread that is
runnable but waits for a core as active, so on a loaded machine its sample counts overstate CPU
time: shares of a /proc figure are the honest ms.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    """`function (file:line)` without the line number: one entry per function."""
    return LINE.sub(")", frame.strip())


def summarize(path: Path) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, self samples per function, inclusive samples per function)."""
    total, own, under = 0, Counter(), Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            under[f] += n
    return total, own, under


def report(path: Path, top: int = 30, ms: float = 0) -> str:
    """The two top lists as text; `ms`: CPU ms per message to share out."""
    total, own, under = summarize(path)
    out = [f"{path.name}: {total} samples"]

    def row(name: str, n: int) -> str:
        per = f" {ms * n / max(total, 1):6.2f} ms/msg" if ms else ""
        return f"  {100 * n / max(total, 1):5.1f}%{per}  {name}"

    out.append("self (where the CPU is):")
    out += [row(k, n) for k, n in own.most_common(top)]
    out.append("inclusive (what it is spent under):")
    out += [row(k, n) for k, n in under.most_common(top)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--ms", type=float, default=0, help="CPU ms per message of the profiled processes")
    args = parser.parse_args()
    print(report(args.profile, args.top, args.ms))


if __name__ == "__main__":
    main()
