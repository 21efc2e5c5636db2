"""schemathesis over every /api operation in /api/openapi.json: inputs that
fit the description and inputs that do not, as an administrator and as
nobody.  No answer may be a 500 (a 502 from an
unreachable push service is an honest answer), and the relay's log must hold no traceback.

Bounded: a fixed number of examples per operation and mode, derandomized
(the same inputs on every run), loopback only: operations that would send
something out (a channel test, a test notification, an announcement's
fan-out, the access-token rotation that would end the fuzzer's own
credentials) are left out, and every notification vendor points at a dead
port on 127.0.0.1."""
import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from tests.helpers import Api, RelayProcess  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = {"positive": 12, "negative": 12, "anonymous": 4}
LEFT_OUT = {("POST", "/api/user/token"), ("POST", "/api/announcement/"),
            ("POST", "/api/subscription/{id}/test"), ("POST", "/api/channel/{id}/test")}
DEAD = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    env = {f"RELAY_NOTIFY_{v}_BASE": DEAD for v in ("WECOM", "TELEGRAM", "SERVERCHAN",
                                                    "WXPUSHER")}
    env.update(RELAY_NOTIFY_WXPUSHER_APP_TOKEN="AT_fuzz", RELAY_ALLOW_PRIVATE_WEBHOOKS="false")
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("fuzzapi")), env=env).start()
    yield p
    p.stop()


def operations(url):
    doc = requests.get(url + "/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)
    for result in schema.get_all_operations():
        op = result.ok()
        if (op.method.upper(), op.path) not in LEFT_OUT:
            yield op


def fuzz(op, mode, n, url, headers, found):
    strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(
        "negative" if mode == "negative" else "positive"))

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        r = case.call(base_url=url, headers=headers, timeout=60)
        if r.status_code == 500:
            found.append(f"{mode} {op.method.upper()} {case.formatted_path} -> "
                         f"{r.status_code} {r.text[:200]} :: {case.as_curl_command()[:400]}")
    try:
        run()
    except Unsatisfiable:
        pass  # nothing to get wrong in this mode (no body, no parameters)


def test_no_500_and_no_traceback_on_any_api_operation(relay):
    admin = Api.login(relay.url)
    found: list[str] = []
    ops = list(operations(relay.url))
    assert len(ops) >= 60
    for op in ops:
        for mode in ("positive", "negative"):
            fuzz(op, mode, EXAMPLES[mode], relay.url, dict(admin.s.headers), found)
        fuzz(op, "anonymous", EXAMPLES["anonymous"], relay.url, {}, found)
    assert found == [], "\n".join(found[:20])
    # The fuzzer's own credentials still work: nothing it did locked it out.
    assert admin.get("/api/user/self")["data"]["username"] == "root"
    log = relay.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 300:][:3000]
