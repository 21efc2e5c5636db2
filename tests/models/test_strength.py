"""Password strength is measured in a helper process (models/strength.py),
so that zxcvbn's 13 MB of dictionaries never stay in the relay: the same
verdicts as zxcvbn in-process, a helper that ends when idle, and a check
that still happens when the helper is killed or cannot start."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from models.strength import Estimator, measure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = [("password1", []), ("correct horse battery staple", []), ("qwertyuiop", []),
           ("alice1987", ["alice"]), ("Tr0ub4dor&3", []), ("x7#Kq!m2vPz$", []), ("ünïcødé-Pässwörd", [])]


def test_the_helper_gives_zxcvbns_own_verdicts():
    async def run():
        est = Estimator()
        try:
            return [await est.measure(p, h) for p, h in SAMPLES], est.started
        finally:
            await est.close()
    answers, started = asyncio.run(run())
    assert started == 1  # one helper for all of them
    assert answers == [measure(p, h) for p, h in SAMPLES]
    assert [a["score"] for a in answers][:3] == [0, 4, 0] or answers[0]["score"] < 2


def test_an_idle_helper_ends_and_the_next_check_starts_another():
    async def run():
        est = Estimator(idle_seconds=0.2)
        first = await est.measure("password1", [])
        proc = est.proc
        await asyncio.sleep(1.0)
        ended = est.proc is None and proc.returncode is not None
        second = await est.measure("password1", [])
        await est.close()
        return first, second, ended, est.started
    first, second, ended, started = asyncio.run(run())
    assert ended and started == 2 and first == second


def test_a_killed_helper_still_leaves_every_password_checked():
    async def run():
        est = Estimator()
        await est.measure("x7#Kq!m2vPz$", [])
        os.kill(est.proc.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        weak = await est.measure("password1", [])  # a new helper, or in-process
        again = await est.measure("password1", [])
        await est.close()
        return weak, again, est.started
    weak, again, started = asyncio.run(run())
    assert weak == again == measure("password1", [])
    assert started == 2


def test_a_helper_that_cannot_start_means_an_in_process_check():
    async def run():
        est = Estimator(command=["/nonexistent/python", "-m", "models.strength"])
        return await est.measure("password1", [])
    assert asyncio.run(run()) == measure("password1", [])


def test_the_server_never_loads_zxcvbn_itself():
    # Neither at start nor for a check: its dictionaries are 13 MB resident
    # for the life of the process.
    code = ("import sys, asyncio, server; server._handlers(); import models.seed; "
            "assert 'zxcvbn' not in sys.modules, 'loaded at start'; "
            "from models.passwords import password_problem, estimator; "
            "why = asyncio.run(password_problem('password1')); assert 'stronger' in why, why; "
            "assert asyncio.run(password_problem('x7#Kq!m2vPz$ok')) is None; "
            "assert 'zxcvbn' not in sys.modules, 'loaded by a check'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_helper_that_answers_nonsense_means_an_in_process_check(tmp_path):
    # Whatever the helper says that is not a verdict, the password is still
    # judged (here a "helper" that echoes a JSON list).
    liar = tmp_path / "liar.py"
    liar.write_text("import sys\nfor line in sys.stdin:\n    print('[1, 2]', flush=True)\n")

    async def run():
        est = Estimator(command=[sys.executable, str(liar)])
        try:
            return await est.measure("password1", [])
        finally:
            await est.close()
    assert asyncio.run(run()) == measure("password1", [])
