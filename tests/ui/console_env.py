"""Shared parts of the console's browser tests: a relay with a fake
upstream and a user, signed-in browsers, and a local webhook receiver."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.ui import browser as chromium
from tests.fakes.openai_upstream import FakeOpenAI
from tests.helpers import ADMIN_PASSWORD, Api

# Each browser test module sets `pytestmark = MARKS`.
MARKS = [pytest.mark.browser, pytest.mark.slow,
         pytest.mark.skipif(not chromium.available(),
                            reason="needs Debian's chromium and chromium-driver "
                                   "(tests/run.sh installs them)")]

PASSWORD = "Blue-Kettle-Harbor-42"
PNG_1PX = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAA"
           "AABJRU5ErkJggg==")
EMAIL = "dora@example.test"


class WebhookReceiver:
    """A local HTTP endpoint that records what is POSTed to it."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append({"path": self.path, "headers": dict(self.headers),
                                 "body": body.decode(errors="replace")})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def upstream():
    fake = FakeOpenAI(slow_delay=1.0).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def env(relay, admin, upstream):
    admin.create_channel(upstream.url + "/mode/slow", ["slow-model"], name="slow")
    admin.set_price("slow-model", input_price=1, output_price=1)
    admin.create_channel(upstream.url, ["gpt-4o-mini", "gpt-4o"], groups=["default", "origin", "vip"],
                         name="fake-openai")
    admin.set_price("gpt-4o-mini", input_price=2, output_price=8)
    admin.set_price("gpt-4o", input_price=5, output_price=15)
    admin.put("/api/console/options", {"purchase_rate": 0.7})
    user = admin.create_user("dora", PASSWORD, quota=10 * 500_000, email=EMAIL)
    return {"user": user, "api": Api.login(relay.url, "dora", PASSWORD)}


@pytest.fixture(scope="module")
def b(relay, env):
    """dora's browser, signed in."""
    br = chromium.Browser()
    br.login(relay.url, "dora", PASSWORD)
    yield br
    br.quit()


@pytest.fixture(scope="module")
def admin_b(relay, env):
    br = chromium.Browser()
    br.login(relay.url, "root", ADMIN_PASSWORD)
    yield br
    br.quit()


def no_script_errors(br) -> None:
    """Script errors and CSP violations fail the test; a 404 of an optional API does not."""
    bad = [e for e in br.errors() if "Failed to load resource" not in e]
    assert bad == [], bad


def ensure_browser_key(env) -> None:
    """The key the key-form test makes, for running a later test on its own."""
    items = env["api"].get("/api/token/?size=100")["data"]["items"]
    if not [k for k in items if k["name"] == "browser-key"]:
        env["api"].create_token("browser-key", unlimited_quota=True, group="origin",
                                allow_ips="127.0.0.1\n10.0.0.0/8\n::1",
                                model_limits_enabled=True, model_limits=["gpt-4o-mini"])


def quota_of(br) -> int:
    return int(br.find("#balance").get_attribute("data-quota") or -1)


# ---- sign-in -------------------------------------------------------------------


def make_usage(relay, env) -> None:
    """One call of each model through the relay, and wait until the records
    and the daily rollups the dashboard reads (through the reports server)
    show both: a fixed second was not enough on a loaded machine."""
    models = ("gpt-4o-mini", "gpt-4o")
    before = own_requests(env)
    key = env["api"].create_token("warmup", unlimited_quota=True)
    for model in models:
        r = requests.post(relay.url + "/v1/chat/completions",
                          headers={"Authorization": f"Bearer {key['key']}"},
                          json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                          timeout=60)
        assert r.status_code == 200
    # Every half second: a chart costs 11 of the account's 600 /api units a
    # minute, and the page under test asks for its own.
    deadline = time.monotonic() + 30
    while True:
        daily = env["api"].get("/api/log/self/daily?days=30")["data"]
        if set(models) <= set(daily["models"]) and own_requests(env) >= before + len(models):
            return
        assert time.monotonic() < deadline, f"usage not shown after 30 s: {daily}"
        time.sleep(0.5)


def own_requests(env, model: str = "") -> int:
    q = f"?model={model}" if model else ""
    return env["api"].get(f"/api/log/self{q}")["data"]["totals"]["requests"]
