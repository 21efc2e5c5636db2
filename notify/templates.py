"""Webhook body templates: jinja2 syntax ({{ title }}) in a sandbox.

In a JSON body (the default), every value is escaped for use inside a JSON
string, so `{"text": "{{ content }}"}` stays valid JSON whatever the content
holds.  Variables: event_type, title, content, user, key_name, balance,
threshold, time.
"""
from __future__ import annotations

import json

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

VARIABLES = ("event_type", "title", "content", "user", "key_name", "balance", "threshold", "time")

DEFAULT_TEMPLATE = ('{"event_type": "{{ event_type }}", "title": "{{ title }}", '
                    '"content": "{{ content }}", "user": "{{ user }}", "key_name": "{{ key_name }}", '
                    '"balance": "{{ balance }}", "threshold": "{{ threshold }}", "time": "{{ time }}"}')


def _json_inner(value) -> str:
    return json.dumps("" if value is None else str(value), ensure_ascii=False)[1:-1]


_plain = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
_json = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False, finalize=_json_inner)


def render(template: str, variables: dict, json_mode: bool = True) -> str:
    """Render; raise ValueError naming the problem (syntax, unknown variable)."""
    env = _json if json_mode else _plain
    try:
        return env.from_string(template or DEFAULT_TEMPLATE).render(
            {k: variables.get(k, "") for k in VARIABLES})
    except TemplateError as exc:
        raise ValueError(f"The body template does not render: {exc}") from None


def check(template: str) -> None:
    render(template, {k: "" for k in VARIABLES}, json_mode=False)
