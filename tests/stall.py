"""Is the event loop free while someone previews a hostile notification
template?  One thread sends the previews, another pings /api/ping the whole
time; both record when each request went out and came back.

Used by tests/notify/test_template_budget.py (which asserts ordering, never a
time) and by bench/template_stall.py (which reports the delays)."""
from __future__ import annotations

import statistics
import threading
import time
import uuid

import requests

# As many loops as the tag limit allows: compiling it is tens of
# milliseconds of pure Python, and a nonce defeats the compiled-template cache.
def heavy_compile(nonce: str) -> str:
    return "{# " + nonce + " #}" + "{% for i in range(3) %}{{ i }}{% endfor %}" * 66


# The template: nested range loops (0.5-1 s per preview before).
NESTED_LOOPS = ("{% for i in range(1000) %}{% for j in range(1000) %}{{ i }}{% endfor %}"
                "{% endfor %}")


def _ping(session: requests.Session, base: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    r = session.get(base + "/api/ping", timeout=30)
    assert r.status_code == 200
    return t0, time.perf_counter()


def baseline(base: str, n: int = 200) -> list[float]:
    s = requests.Session()
    return [b - a for a, b in (_ping(s, base) for _ in range(n))]


def storm(base: str, headers: dict, templates: list[str]) -> dict:
    """Preview each template in turn while pinging; returns the timings."""
    previews: list[tuple[float, float, int, str]] = []
    pings: list[tuple[float, float]] = []
    done = threading.Event()

    def pinger():
        s = requests.Session()
        while not done.is_set():
            pings.append(_ping(s, base))

    t = threading.Thread(target=pinger, daemon=True)
    t.start()
    time.sleep(0.05)
    s = requests.Session()
    s.headers.update(headers)
    for tpl in templates:
        t0 = time.perf_counter()
        r = s.post(base + "/api/subscription/preview", timeout=60,
                   json={"channel_type": "webhook", "event_type": "announcement",
                         "channel_config": {"body_template": tpl}})
        previews.append((t0, time.perf_counter(), r.status_code, r.json().get("message", "")))
    done.set()
    t.join()
    return {"previews": previews, "pings": pings}


def pings_inside(result: dict, preview: tuple) -> int:
    """Pings sent after the preview went out and answered before it came back."""
    start, end = preview[0], preview[1]
    return sum(1 for a, b in result["pings"] if a > start and b < end)


def _ms(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def report(base: str, headers: dict, rounds: int = 10) -> dict:
    """The figures: ping latency alone, while harmless previews run (the
    control: same requests, trivial template), and while hostile ones run.
    On a busy machine the control shows what the machine itself adds."""
    quiet = baseline(base)
    hostile = []
    for _ in range(rounds):
        hostile += [heavy_compile(uuid.uuid4().hex), NESTED_LOOPS]
    control = storm(base, headers, ["{{ title }}" + "{# " + uuid.uuid4().hex + " #}"
                                    for _ in hostile])
    res = storm(base, headers, hostile)
    during = [b - a for a, b in res["pings"]]
    calm = [b - a for a, b in control["pings"]]
    p50 = statistics.median(quiet)
    return {
        "previews": len(res["previews"]),
        "preview_statuses": sorted({p[2] for p in res["previews"]}),
        "preview_ms_max": round(max(p[1] - p[0] for p in res["previews"]) * 1000, 1),
        "pings_during": len(during),
        "ping_ms_quiet": {"p50": _ms(quiet, 0.5), "p99": _ms(quiet, 0.99), "max": _ms(quiet, 1)},
        "ping_ms_control": {"p50": _ms(calm, 0.5), "p99": _ms(calm, 0.99), "max": _ms(calm, 1)},
        "ping_ms_hostile": {"p50": _ms(during, 0.5), "p99": _ms(during, 0.99),
                            "max": _ms(during, 1)},
        "max_delay_ms": round((max(during) - p50) * 1000, 2),
    }
