"""Summarise py-spy's raw (collapsed-stack) output into hot spots.

Each line of the raw format is `frame;frame;...;leaf COUNT`, a frame being
`function (path:line)`.  We fold line numbers away and report:
- self:      where the samples were (the leaf frame),
- inclusive: functions on the stack, each counted once per sample,
- layers:    self samples by the package of the leaf (tornado, pymongo,
             json, our relay/ and handlers/ ...), to see where a cut pays.
- parts:     each sample given to the innermost frame that belongs to a
             known part (upstream client, inbound HTTP server, relay code,
             database driver); frames of json, re, selectors... count for
             the part that called them.

Usable on its own: `python bench/hotspots.py bench/results/profile.txt`.
"""
from __future__ import annotations

import os
import re
import sys
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
OURS = ("relay/", "handlers/", "models/", "notify/", "server.py", "settings.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fold(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    path = m.group("path")
    # py-spy shortens paths by sys.path entries and shows handlers/base.py
    # as plain base.py; give our files their folder back.
    if "/" not in path and os.path.exists(os.path.join(ROOT, "handlers", path)):
        path = "handlers/" + path
    return m.group("func"), path


def _layer(path: str) -> str:
    if path.startswith(OURS):
        return path.split("/", 1)[0] + "/" if "/" in path else path
    if path.startswith("<frozen") or not path:
        return "(interpreter)"
    head = path.split("/", 1)[0]
    return head.removesuffix(".py")


_PARTS = (
    ("upstream client (curl_httpclient, relay/upstream/client.py)",
     ("relay/upstream/client.py", "tornado/curl_httpclient.py", "tornado/httpclient.py")),
    ("database driver (pymongo: usage and balance flush)", ("pymongo/", "bson/")),
    ("inbound HTTP server (tornado web/http1connection/iostream)",
     ("tornado/web.py", "tornado/http1connection.py", "tornado/iostream.py",
      "tornado/httputil.py", "tornado/routing.py", "tornado/httpserver.py",
      "tornado/tcpserver.py", "tornado/netutil.py")),
    # server.py is left out: its main() is at the root of every stack, and
    # its find_handler is routing, which the caller (tornado) accounts for.
    ("relay code (handlers/, relay/, models/, notify/)", tuple(p for p in OURS if "/" in p)),
)


def _part(frames: list[tuple[str, str]]) -> str:
    for _, path in reversed(frames):
        for name, prefixes in _PARTS:
            if path.startswith(prefixes):
                return name
    return "event loop and the rest (asyncio, tornado ioloop/gen)"


def summarise(text: str, top: int = 15) -> dict:
    """Hot spots of the main thread (the event loop).  Samples of other
    threads (the executor's idle workers, which py-spy cannot always tell
    idle) are only counted."""
    self_c: Counter = Counter()
    incl: Counter = Counter()
    layers: Counter = Counter()
    parts: Counter = Counter()
    total = others = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if stack.startswith("Thread._bootstrap"):
            others += n
            continue
        total += n
        frames = [_fold(f) for f in stack.split(";")]
        func, path = frames[-1]
        self_c[f"{func} ({path})"] += n
        layers[_layer(path)] += n
        parts[_part(frames)] += n
        for name in {f"{fn} ({p})" for fn, p in frames}:
            incl[name] += n

    def rows(counter: Counter, keep=lambda name: True) -> list[dict]:
        out = [{"function": k, "samples": v, "share": round(v / total, 4)}
               for k, v in counter.most_common() if keep(k)]
        return out[:top]

    def ours(name: str) -> bool:
        path = name.rsplit("(", 1)[-1]
        return path.startswith(OURS) and incl[name] < 0.9 * total

    return {"samples": total, "other_thread_samples": others,
            "self": rows(self_c),
            "inclusive_ours": rows(incl, ours),
            # The event loop's own frames are on every stack and say nothing.
            "inclusive_all": rows(incl, lambda k: incl[k] < 0.9 * total),
            "layers": rows(layers),
            "parts": rows(parts)}


def render(summary: dict) -> str:
    out = [f"{summary['samples']} samples of the main thread (active ones only: waiting in "
           f"epoll is not counted); {summary['other_thread_samples']} of other threads left out"]
    for key, title in (("parts", "Where the time goes"),
                       ("self", "Self time (leaf frame)"),
                       ("inclusive_ours", "Inclusive time, relay code"),
                       ("inclusive_all", "Inclusive time, everything"),
                       ("layers", "Self time by layer")):
        out.append(f"\n{title}:")
        for r in summary[key]:
            out.append(f"  {100 * r['share']:5.1f}%  {r['samples']:6d}  {r['function']}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(summarise(f.read(), top=int(sys.argv[2]) if len(sys.argv) > 2 else 15)))
