"""Channel order: priority first, weight within a priority, resting channels last."""
import random
import time
from collections import Counter
from types import SimpleNamespace

from models.records import Channel
from relay.scheduler import Scheduler


def ch(cid, priority=0, weight=1, enabled=True, groups=("default",), models=("m",)):
    return Channel(id=cid, name=f"c{cid}", type="openai", base_url="http://x", key="k",
                   models=tuple(models), groups=tuple(groups), priority=priority, weight=weight,
                   model_mapping={}, enabled=enabled)


def sched(channels, **kw):
    catalog = SimpleNamespace(channels=channels, version=1)
    return Scheduler(catalog, rng=random.Random(42), **kw), catalog


def test_priority_then_weight():
    s, _ = sched([ch(1, 0, 1), ch(2, 10, 1), ch(3, 10, 3), ch(4, 0, 1, enabled=False)])
    firsts = Counter(s.candidates("default", "m")[0].id for _ in range(4000))
    assert set(firsts) == {2, 3}
    assert 2.5 < firsts[3] / firsts[2] < 3.5
    order = [c.id for c in s.candidates("default", "m")]
    assert set(order[:2]) == {2, 3} and order[2] == 1 and 4 not in order


def test_group_and_model_filter_and_cache_follows_catalog():
    s, cat = sched([ch(1, groups=("vip",)), ch(2, models=("other",))])
    assert [c.id for c in s.candidates("vip", "m")] == [1]
    assert s.candidates("default", "m") == []
    cat.channels = cat.channels + [ch(3)]
    cat.version += 1
    assert [c.id for c in s.candidates("default", "m")] == [3]


def test_failing_channel_rests_then_returns():
    s, _ = sched([ch(1, 10), ch(2, 0)], trip_after=3, base_rest=0.2)
    bad = s.catalog.channels[0]
    for _ in range(3):
        s.failure(bad, "500")
    assert [c.id for c in s.candidates("default", "m")] == [2, 1]  # last, not gone
    time.sleep(0.25)
    assert [c.id for c in s.candidates("default", "m")] == [1, 2]
    for _ in range(3):
        s.failure(bad, "500")
    assert s.health[1].resting_until - time.monotonic() > 0.3  # rests twice as long now
    s.success(bad)
    assert [c.id for c in s.candidates("default", "m")] == [1, 2]


def test_zero_weight_still_gets_tried_last():
    s, _ = sched([ch(1, 0, 0), ch(2, 0, 5)])
    assert [c.id for c in s.candidates("default", "m")] == [2, 1]
