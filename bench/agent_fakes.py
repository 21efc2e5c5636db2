"""The vendor fakes bench/agents.py loads, in one process: the faithful
OpenAI (chat completions and Responses), Anthropic and Gemini fakes of
tests/fakes/, each on its own thread and port, keeping no copy of the
requests (memory stays flat under load).  Prints one JSON line with their
addresses, then serves until killed.

    python bench/agent_fakes.py
"""
from __future__ import annotations

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fakes.anthropic_upstream import FakeAnthropic  # noqa: E402
from tests.fakes.gemini_upstream import FakeGemini  # noqa: E402
from tests.fakes.openai_upstream import FakeOpenAI  # noqa: E402


def main() -> None:
    fakes = {"openai": FakeOpenAI(record=False), "anthropic": FakeAnthropic(),
             "gemini": FakeGemini()}
    for fake in fakes.values():
        fake.recording = False
        fake.start()
    print(json.dumps({name: fake.url for name, fake in fakes.items()}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
