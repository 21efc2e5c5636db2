"""What a newcomer runs first: the README opens with exactly the two
commands (.ci/run runs the second), test runs keep the tree clean, and the
README's pictures are ones the browser tests take."""
from __future__ import annotations

import glob
import os
import re
import subprocess

from tests.ui import browser
from tests.helpers import ROOT


def readme() -> str:
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    first_block = re.match(r"# [^\n]+\n\n```bash\n(.*?)```\n", readme(), re.S)
    assert first_block, "the README must open with its commands"
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    serve, test = commands
    # Debian's python3 is externally managed and there is no `python`: a venv, used by both.
    assert serve.startswith("python3 -m venv") and ".venv" in serve
    assert serve.endswith(".venv/bin/python server.py") and "python " not in serve.split("&&")[0]
    assert test == "bash tests/run.sh"
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^bash tests/run\.sh\b", ci, re.M)
    run = open(os.path.join(ROOT, "tests", "run.sh")).read()
    assert ".venv/bin/python -m pytest" in run and "python3-venv" in run
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, "tests", "run.sh")]).returncode == 0


def test_screenshots_go_to_an_ignored_folder():
    tracked = os.path.join(ROOT, "test-artifacts", "screenshots")
    assert not os.path.abspath(browser.SCREENSHOTS).startswith(tracked)
    if os.path.isdir(os.path.join(ROOT, ".git")) or os.path.isfile(os.path.join(ROOT, ".git")):
        probe = os.path.relpath(os.path.join(browser.SCREENSHOTS, "x.png"), ROOT)
        assert subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT).returncode == 0


def test_every_readme_picture_is_taken_by_a_browser_test():
    shown = set(re.findall(r"test-artifacts/screenshots/([\w.-]+)\.png", readme()))
    taken = set()
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True):
        if "node_modules" in path:
            continue
        text = open(path).read()
        if ".screenshot(" in text:  # a literal name, or one in a loop's table
            taken |= set(re.findall(r"""["']([\w.-]+)["']""", text))
    assert shown and shown <= taken, shown - taken
    for name in shown:
        assert os.path.exists(os.path.join(ROOT, "test-artifacts", "screenshots", name + ".png"))
