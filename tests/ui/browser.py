"""Debian's headless Chromium driven by selenium, for the console tests.

Never a downloaded browser: /usr/bin/chromium and /usr/bin/chromedriver
come from the chromium and chromium-driver packages (tests/run.sh).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A test run writes its screenshots to an ignored folder, so that it never
# dirties the tree; `bash tests/refresh_screenshots.sh` copies the README's
# pictures from there to test-artifacts/screenshots on purpose.
SCREENSHOTS = os.path.join(ROOT, "test-artifacts", "tmp", "screenshots")


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


class Browser:
    """One Chromium with a fresh profile; `quit()` removes the profile."""

    def __init__(self, width: int = 1366, height: int = 768, lang: str = ""):
        """lang (e.g. "zh-CN"): the browser's language, sent as Accept-Language."""
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        if lang:
            opts.add_argument(f"--lang={lang}")
            opts.add_experimental_option("prefs", {"intl.accept_languages": f"{lang},{lang.split('-')[0]}"})
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={self.profile}", f"--window-size={width},{height}"):
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        self.driver.set_page_load_timeout(60)
        # The window size includes the browser's own bars (and headless
        # Chromium has a minimum width): set the page's viewport exactly, as
        # a phone's (mobile) when narrow.
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    # ---- helpers -------------------------------------------------------------
    def get(self, url: str) -> None:
        self.driver.get(url)

    def find(self, css: str, timeout: float = 20):
        return WebDriverWait(self.driver, timeout).until(
            EC.presence_of_element_located((By.CSS_SELECTOR, css)))

    def visible(self, css: str, timeout: float = 20):
        return WebDriverWait(self.driver, timeout).until(
            EC.visibility_of_element_located((By.CSS_SELECTOR, css)))

    def click(self, css: str, timeout: float = 20) -> None:
        WebDriverWait(self.driver, timeout).until(
            EC.element_to_be_clickable((By.CSS_SELECTOR, css))).click()

    def all(self, css: str):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def type(self, css: str, text: str, clear: bool = True) -> None:
        el = self.visible(css)
        if clear:
            el.clear()
        el.send_keys(text)

    def wait(self, cond, timeout: float = 30, what: str = "condition"):
        """Poll cond(driver) until it returns something truthy."""
        return WebDriverWait(self.driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: cond(d), message=f"timed out waiting for {what}")

    def press(self, rows_css: str, name: str, button_css: str, timeout: float = 30) -> None:
        """Click a button in the row whose data-name is `name`, finding the row
        and clicking in one retried step: a live update (the keys table on a
        balance event) draws the rows again at any moment."""
        def once(d):
            row = next((r for r in self.all(rows_css) if r.get_attribute("data-name") == name), None)
            return row is not None and row.find_element(By.CSS_SELECTOR, button_css).click() is None
        self.wait(once, timeout, what=f"{button_css} in {name}'s row")

    def texts(self, css: str) -> list[str]:
        """Texts of all matches, read at once (rows re-rendered meanwhile cannot go stale)."""
        return self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)", css)

    def text(self, css: str) -> str:
        return self.find(css).text

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def errors(self) -> list[str]:
        """Severe console messages (script errors, CSP violations) since the last call."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, name: str) -> str:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        path = os.path.join(SCREENSHOTS, f"{name}.png")
        time.sleep(0.3)  # let a transition (toast, chart) settle
        self.driver.save_screenshot(path)
        return path

    def login(self, base: str, username: str, password: str) -> None:
        self.get(base + "/console/login")
        self.type("#username", username)
        self.type("#password", password)
        self.click("#login-submit")
        self.wait(lambda d: "/console/login" not in d.current_url, what="sign-in")
        self.find("#live-dot.open")
