"""The Anthropic and Gemini fakes playing the coding-agent script of
tests/fakes/agent_script.py (a shell tool round trip) when an agent offers
its shell tool; every other request is answered as the plain fakes do."""
from __future__ import annotations

from tests.fakes import agent_script
from tests.fakes import anthropic_upstream as anth
from tests.fakes import gemini_upstream as gem


class ScriptedMessages(anth.MessagesHandler):
    def plan(self, b: dict):
        got = agent_script.anthropic_plan(b)
        if got is None:
            return super().plan(b)
        blocks, stop = got
        return blocks, stop, None


class ScriptedModel(gem.ModelHandler):
    def plan(self):
        return agent_script.gemini_plan(self.body) or super().plan()


def _swap(routes: list, old, new) -> list:
    return [(r[0], new if r[1] is old else r[1], *r[2:]) for r in routes]


class ScriptedAnthropic(anth.FakeAnthropic):
    def routes(self):
        return _swap(super().routes(), anth.MessagesHandler, ScriptedMessages)


class ScriptedGemini(gem.FakeGemini):
    def routes(self):
        return _swap(super().routes(), gem.ModelHandler, ScriptedModel)
