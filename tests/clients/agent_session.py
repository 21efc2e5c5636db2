"""A Claude Code conversation replayed turn by turn, from what the pinned
CLI really sends (tests/fixtures/claude_code_requests.json): its first
request, then each answer appended as it came back (thinking, text,
tool_use), followed by the tool's result when the model asked for one and
by a new question when it did not, with the cache marker moved to the new
last block as Claude Code moves it.  Its headers and metadata.user_id
(which carries the session) are the CLI's.

Used by tests/relay/test_sessions.py and bench/sticky.py."""
from __future__ import annotations

import copy
import json
import os

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "claude_code_requests.json")


def read_blocks(text: str) -> list[dict]:
    """The content blocks of a streamed Messages answer."""
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    for event in text.split("\n\n"):
        data = next((line[6:] for line in event.splitlines() if line.startswith("data: ")), None)
        if not data:
            continue
        doc = json.loads(data)
        kind = doc.get("type")
        if kind == "content_block_start":
            blocks.append(dict(doc["content_block"]))
        elif kind == "content_block_delta":
            d, block = doc["delta"], blocks[doc["index"]]
            if d["type"] == "text_delta":
                block["text"] = block.get("text", "") + d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + d["thinking"]
            elif d["type"] == "signature_delta":
                block["signature"] = d["signature"]
            elif d["type"] == "input_json_delta":
                partial[doc["index"]] = partial.get(doc["index"], "") + d["partial_json"]
        elif kind == "error":
            raise RuntimeError(f"error event: {data}")
    for i, js in partial.items():
        blocks[i]["input"] = json.loads(js) if js else {}
    return blocks


class AgentSession:
    def __init__(self, key: str, model: str, session: str):
        with open(FIXTURE) as fh:
            first = json.load(fh)["requests"][0]
        self.body = copy.deepcopy(first["body"])
        self.body["model"] = model
        self.body["metadata"] = {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "",
                                                        "session_id": session})}
        self.headers = dict(first["headers"], **{"x-api-key": key})
        self.turns = 0

    def send(self, base: str, timeout: float = 60) -> requests.Response:
        """One turn: the request as it stands; the answer is appended and
        the next user turn added.  Returns the HTTP response (read whole)."""
        r = requests.post(f"{base}/v1/messages?beta=true", data=json.dumps(self.body),
                          headers=self.headers, timeout=timeout)
        if r.status_code != 200:
            return r
        blocks = read_blocks(r.text)
        self.turns += 1
        msgs = self.body["messages"]
        msgs.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        if uses:
            nxt = [{"type": "tool_result", "tool_use_id": u["id"],
                    "content": f"1\tline {self.turns} of the file read by {u['name']}\n"}
                   for u in uses]
        else:
            nxt = [{"type": "text", "text": f"Thanks. Next step {self.turns}: go on."}]
        # Claude Code keeps the marker on its environment block (the system
        # message in `messages`) and moves the other to the newest block.
        for m in msgs[2:]:
            for b in m["content"] if isinstance(m["content"], list) else ():
                b.pop("cache_control", None)
        nxt[-1]["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user", "content": nxt})
        return r
