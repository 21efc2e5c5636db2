"""Session-wide real servers: one embedded MongoDB-compatible server, and
per-module relays (each with its own database name) on 127.0.0.1."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models.embedded import EmbeddedMongo  # noqa: E402
from tests.fakes.anthropic_upstream import FakeAnthropic  # noqa: E402
from tests.fakes.gemini_upstream import FakeGemini  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402
from tests.helpers import Api, RelayProcess  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests that take a while (CI runs them)")
    config.addinivalue_line("markers", "browser: drives headless Chromium")


# The modules that take longest (a minute or more each, measured with
# --durations), longest first.  tests/run.sh hands whole modules to worker
# processes in collection order (--dist loadfile --no-loadscope-reorder), so
# these start first and no worker is left running one of them alone at the
# end while the others wait.  A module not listed keeps its place after them.
LONGEST_FIRST = (
    "tests/console/test_million_records.py",
    "tests/relay/money/test_money_crash.py",
    "tests/handlers/test_fuzz_api.py",
    "tests/ui/test_console_zh.py",
    "tests/ui/test_console_browser_admin.py",
    "tests/ui/test_console_browser.py",
    "tests/ui/test_console_fit.py",
    "tests/relay/money/test_across_relays.py",
    "tests/relay/money/test_billing_property.py",
    "tests/test_lifecycle.py",
    "tests/handlers/test_sessions.py",
    "tests/relay/faces/test_fuzz_faces.py",
    "tests/notify/test_notify_api.py",
    "tests/handlers/test_small_holes.py",
    "tests/handlers/test_signin_throttle.py",
    "tests/relay/faces/test_image_edits_translations.py",
    "tests/relay/test_responses_socket.py",
    "tests/handlers/test_accounts.py",
    "tests/relay/money/test_limits.py",
    "tests/relay/faces/test_audio.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # Stable: the tests of a module, and the modules not listed, keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_sessionfinish(session, exitstatus):
    """In CI nothing may skip: a missing CLI, browser or library that a
    developer may lack locally would otherwise hide a failure there."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get("CI") and skipped and exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; every test must run in CI:",
                            red=True)
        for rep in skipped:
            reporter.write_line(f"  {rep.nodeid}: {rep.longrepr[-1] if rep.longrepr else ''}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def mongo_url(tmp_path_factory):
    """The database server every test uses: RELAY_TEST_MONGO_URL names any
    MongoDB-compatible server (a real MongoDB, SecantusDB); unset, the
    embedded default is started for the session."""
    url = os.environ.get("RELAY_TEST_MONGO_URL", "")
    if url:
        yield url
        return
    db = EmbeddedMongo(str(tmp_path_factory.mktemp("mongo")))
    url = db.start()
    yield url
    db.stop()


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory):
    """A relay process with a fresh database, shared by one test module."""
    proc = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("relay"))).start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_relay(mongo_url, tmp_path):
    """A relay process of one's own, for tests that stop or kill it."""
    procs = []

    def make(**kw) -> RelayProcess:
        p = RelayProcess(mongo_url, str(tmp_path / f"relay{len(procs)}"), **kw).start()
        procs.append(p)
        return p
    yield make
    for p in procs:
        p.stop()


@pytest.fixture(scope="module")
def admin(relay) -> Api:
    return Api.login(relay.url)


@pytest.fixture(scope="module")
def fake():
    """A fake OpenAI upstream on a socket (tests/fakes/openai_upstream.py), one per
    test module; a module that needs another upstream defines its own `fake`."""
    f = FakeOpenAI().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def fakes():
    """One fake upstream per vendor family, {"openai", "anthropic",
    "gemini"}, for a test module (a module that needs another set adds to
    it by overriding `fakes` and asking for this one)."""
    got = {"openai": FakeOpenAI().start(), "anthropic": FakeAnthropic().start(),
           "gemini": FakeGemini().start()}
    yield got
    for f in got.values():
        f.stop()
