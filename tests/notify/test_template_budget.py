"""Notification body templates render on a budget (notify/templates.py), and
previewing a hostile one leaves the event loop free for everyone else."""
import asyncio
import uuid

import pytest

from notify import templates
from tests import stall

VARS = {k: "" for k in templates.VARIABLES}

HOSTILE = {
    "nested loops": stall.NESTED_LOOPS,
    "three nested loops": "{% for a in range(100) %}{% for b in range(100) %}"
                          "{% for c in range(100) %}x{% endfor %}{% endfor %}{% endfor %}",
    "huge repeat": "{{ 'x' * 1000000000 }}",
    "huge power": "{{ 2 ** 10000000 }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(60) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "doubling by block": "{% set ns = namespace(s='x') %}{% for i in range(60) %}"
                         "{% set ns.s %}{{ ns.s }}{{ ns.s }}{% endset %}{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                         "{% endmacro %}{{ f(40) }}",
    "output flood": "{% for i in range(20000) %}{{ 'x' * 1000 }}{% endfor %}",
    "join separator": "{{ range(20000)|join('x' * 50000) }}",
    "join alone": "{% set s = 'x' * 60000 %}{{ [s, s, s]|join }}",
    "replace blow-up": "{{ ('a' * 60000).replace('a', 'bbbb') }}",
    "long source": "{{ title }}" * 2000,
}
REFUSED = {
    "padding method": "{{ 'x'.center(1000000000) }}",
    "padding filter": "{{ 'x'|center(1000) }}",
    "percent format": "{{ '%999999999s' % 'x' }}",
    "bytes": "{{ (1).to_bytes(1000000000, 'big') }}",
    "recursive loop": "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}",
    "lipsum": "{{ lipsum(100000) }}",
    "private attribute": "{{ ''.__class__ }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_over_budget_is_a_clear_error(name):
    with pytest.raises(ValueError, match="over its budget"):
        templates.render(HOSTILE[name], VARS)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_dangerous_constructs_are_not_available(name):
    with pytest.raises(ValueError, match="does not render"):
        templates.render(REFUSED[name], VARS)


def test_ordinary_templates_still_work():
    v = dict(VARS, title="Low balance", content="line one\nline two", balance=123456789,
             user="ann")
    assert templates.render('{"t": "{{ title }}", "b": {{ balance }}}', v) == \
        '{"t": "Low balance", "b": 123456789}'
    tpl = ("{% for line in content.split('\\n') %}- {{ line|upper }}\n{% endfor %}"
           "{{ user|title }} has {{ (balance / 500000)|round(2) }} credits"
           "{{ ' (low)' if balance < 10 ** 9 else '' }}")
    out = templates.render(tpl, v, json_mode=False)
    assert out == "- LINE ONE\n- LINE TWO\nAnn has 246.91 credits (low)"
    templates.check("{% for line in content.split('\\n') %}- {{ line|upper }}\n{% endfor %}")
    templates.check("")  # the default template


def test_check_uses_realistic_lengths():
    # Fine with empty variables, over budget with a 20,000-character announcement.
    tpl = "{% for i in range(10) %}{{ content }}{% endfor %}"
    templates.render(tpl, VARS)
    with pytest.raises(ValueError, match="over its budget"):
        templates.check(tpl)


def test_render_refuses_to_run_on_the_event_loop():
    async def main():
        with pytest.raises(RuntimeError, match="block the event loop"):
            templates.render("{{ title }}", VARS)
    asyncio.run(main())


def test_run_leaves_the_event_loop_free():
    """While the template thread compiles and renders, the loop keeps
    turning (it would not turn at all if the work ran on it)."""
    async def main():
        ticks = 0
        stop = False

        async def ticker():
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)
        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks
        with pytest.raises(ValueError, match="over its budget"):
            await templates.run(templates.render,
                                stall.NESTED_LOOPS + "{# " + uuid.uuid4().hex + " #}", VARS)
        during = ticks - before
        stop = True
        await task
        return during
    assert asyncio.run(main()) > 0


# ---- end to end: save, preview, and the event loop ----------------------------
@pytest.fixture(scope="module")
def api(relay, admin):
    return admin


def test_hostile_template_refused_at_save_and_preview(api):
    body = {"name": "h", "event_types": ["announcement"], "channel_type": "webhook",
            "channel_config": {"url": "https://hooks.example.test/x",
                               "body_template": stall.NESTED_LOOPS}}
    r = api.post("/api/subscription/", body, expect=400)
    assert "over its budget" in r["message"]
    r = api.post("/api/subscription/preview", {"channel_type": "webhook",
                                               "channel_config": body["channel_config"]},
                 expect=400)
    assert "over its budget" in r["message"]


def test_event_loop_stays_free_during_hostile_previews(relay, api, record_property):
    """Pings keep being answered while hostile previews run; the delays are
    reported here and by bench/template_stall.py (tests assert no times)."""
    tpls = [stall.heavy_compile(uuid.uuid4().hex) for _ in range(3)] + [stall.NESTED_LOOPS]
    res = stall.storm(relay.url, dict(api.s.headers), tpls)
    for p in res["previews"]:
        assert p[2] in (200, 400), p
    assert any(p[2] == 400 and "over its budget" in p[3] for p in res["previews"])
    inside = [stall.pings_inside(res, p) for p in res["previews"][:3]]
    assert all(n >= 1 for n in inside), inside
    during = [b - a for a, b in res["pings"]]
    record_property("ping_ms_max_during_hostile_previews", round(max(during) * 1000, 2))
    print(f"\nping max {max(during) * 1000:.1f} ms over {len(during)} pings during "
          f"{len(tpls)} hostile previews; pings inside each compile-heavy preview: {inside}")
    assert "Traceback" not in relay.log()
