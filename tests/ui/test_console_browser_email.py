"""The account page's e-mail address in a real browser: a new address waits
for the code mailed to it (notify/contact.py), and becomes the account's
once the code is typed in.  Mail goes to an SMTP sink on 127.0.0.1."""
from __future__ import annotations

import re
import uuid

import pytest

from tests.fakes.smtp_sink import SmtpSink
from tests.helpers import Api, RelayProcess
from tests.notify.notify_helpers import wait_for
from tests.ui import browser as chromium
from tests.ui.console_env import MARKS, PASSWORD, no_script_errors

pytestmark = MARKS


@pytest.fixture(scope="module")
def sink():
    s = SmtpSink().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def relay(mongo_url, tmp_path_factory, sink):
    p = RelayProcess(mongo_url, str(tmp_path_factory.mktemp("uimail")), env={
        "RELAY_SMTP_HOST": "127.0.0.1", "RELAY_SMTP_PORT": str(sink.port),
        "RELAY_SMTP_TLS": "none"}).start()
    yield p
    p.stop()


@pytest.fixture
def browser():
    br = chromium.Browser()
    yield br
    br.quit()


def test_changing_the_address_waits_for_its_code(relay, sink, browser):
    admin = Api.login(relay.url)
    name = "m" + uuid.uuid4().hex[:6]
    admin.create_user(name, PASSWORD, email=f"{name}@old.example")
    b = browser
    b.login(relay.url, name, PASSWORD)
    b.get(relay.url + "/console/account")
    b.find("body[data-ready='1']")
    assert b.text("#email-current") == f"{name}@old.example"
    new = f"{name}@new.example"
    b.type("#email-new", new)
    b.click("#email-save")
    b.wait(lambda d: b.find("#email-code-form").is_displayed(), what="the code form")
    assert new in b.text("#email-pending")
    assert b.text("#email-current") == f"{name}@old.example"  # not yet
    mail = wait_for(lambda: [m["message"] for m in sink.messages if new in m["to"]],
                    what="the code")[0]
    code = re.search(r"^ +([A-Z2-9]{10})\s*$", mail.get_content(), re.M).group(1)
    b.type("#email-code", "WRONG")
    b.click("#email-confirm")
    b.wait(lambda d: "wrong" in b.text("#email-status"), what="the wrong code refused")
    b.type("#email-code", code)
    b.click("#email-confirm")
    b.wait(lambda d: b.text("#email-current") == new, what="the new address")
    assert not b.find("#email-code-form").is_displayed()
    b.screenshot("account-email")
    no_script_errors(b)
