"""relay/serving/buglog.py: a bug logs its traceback once per window, then one line."""
import logging

from relay.serving.buglog import TracebackLimiter, log_bug


def boom(kind=ValueError):
    try:
        raise kind("x")
    except Exception as exc:  # noqa: BLE001 - the exception is the point
        return exc


def test_same_bug_once_per_window_and_a_burst_cap():
    now = [0.0]
    lim = TracebackLimiter(window=60, burst=2, clock=lambda: now[0])
    assert lim.allow(boom()) is True
    assert lim.allow(boom()) is False          # same place, same type
    assert lim.allow(boom(KeyError)) is True   # another bug
    assert lim.allow(boom(TypeError)) is False  # over the burst
    now[0] = 61
    assert lim.allow(boom()) is True


def test_log_bug_writes_one_line_when_limited(caplog):
    logger = logging.getLogger("t.buglog")
    with caplog.at_level(logging.ERROR, logger="t.buglog"):
        for _ in range(3):
            log_bug(logger, "GET /x", boom(LookupError))
    records = [r for r in caplog.records if r.name == "t.buglog"]
    assert len(records) == 3
    assert records[0].exc_info is not None
    assert all(r.exc_info is None and "logged recently" in r.getMessage() for r in records[1:])
