"""Password strength by zxcvbn, measured in a helper process.

zxcvbn's dictionaries are 13 MB resident once imported, and a Python
process does not give that back.  A relay checks a password rarely (a sign-up,
a change, an administrator's reset), so the estimator lives in a child
process (`python -m models.strength`) started on the first check and ended
after IDLE_SECONDS without one.  It reads one JSON line per password on
stdin and answers one JSON line on stdout; the pipe is the child's only
input, and the child ends when the pipe does (with us, if we die).

If the child cannot be started or does not answer in time, the check runs
in this process instead (and the memory stays): a password is never
accepted unchecked.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

log = logging.getLogger("models.strength")

IDLE_SECONDS = 60.0
ANSWER_SECONDS = 10.0
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(password: str, hints: list) -> dict:
    """zxcvbn's verdict, reduced to what the password rule shows."""
    from zxcvbn import zxcvbn
    result = zxcvbn(password, user_inputs=hints)
    feedback = result.get("feedback") or {}
    return {"score": int(result["score"]), "warning": feedback.get("warning") or "",
            "suggestions": list(feedback.get("suggestions") or ())}


class Estimator:
    """The helper process, one check at a time."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS, command: list | None = None):
        self.idle_seconds = idle_seconds
        self.command = command or [sys.executable, "-m", "models.strength"]
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0  # helper processes started, for tests and logs
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.TimerHandle | None = None

    async def measure(self, password: str, hints: list) -> dict:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # pipes and lock belong to one loop (a CLI run makes its own)
            if self.proc is not None and self.proc.returncode is None:
                self.proc.kill()
            self.proc, self._idle, self._loop = None, None, loop
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            try:
                answer = await asyncio.wait_for(self._ask(password, hints), ANSWER_SECONDS)
            except (OSError, ValueError, KeyError, TypeError, asyncio.TimeoutError,
                    EOFError) as exc:
                log.warning("password strength helper failed (%s); checking in-process",
                            str(exc) or type(exc).__name__)
                await self.close()
                return measure(password, hints)
            self._idle = loop.call_later(
                self.idle_seconds, lambda: asyncio.ensure_future(self._retire()))
            return answer

    async def _retire(self) -> None:
        async with self._lock:  # not under a check that began meanwhile
            await self.close()

    async def _ask(self, password: str, hints: list) -> dict:
        if self.proc is None or self.proc.returncode is not None:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, cwd=_ROOT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            self.started += 1
        self.proc.stdin.write(json.dumps({"password": password, "hints": hints}).encode()
                              + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise EOFError("the helper ended")
        answer = json.loads(line)
        return {"score": int(answer["score"]), "warning": str(answer["warning"]),
                "suggestions": [str(s) for s in answer["suggestions"]]}

    async def close(self) -> None:
        """End the helper (it exits when its stdin closes)."""
        proc, self.proc = self.proc, None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 5)
        except (OSError, asyncio.TimeoutError):
            proc.kill()
            await proc.wait()


def main() -> None:
    for line in sys.stdin.buffer:
        ask = json.loads(line)
        out = measure(str(ask["password"]), [str(h) for h in ask.get("hints") or ()])
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
