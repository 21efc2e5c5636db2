"""Streamed Responses events <-> canonical chat.completion.chunks.

ChunksToEvents writes the event sequence the official SDKs and Codex parse
(openai-python's ResponseStreamEvent types): response.created,
response.in_progress, then per output item output_item.added,
content_part.added / reasoning_summary_part.added, the deltas, their .done
events and output_item.done, and last response.completed (or .incomplete
or .failed), every event numbered by sequence_number.  Items are written
one after another, each closed before the next opens, as OpenAI does.

A call of a custom (freeform) tool arrives as JSON-wrapped function
arguments ({"input": "..."}) that cannot be unwrapped piece by piece: its
arguments are buffered, and at its close the raw input goes out as one
response.custom_tool_call_input.delta, then .done.

EventsToChunks reads such a stream from a Responses-only channel back into
chunks for chat, Anthropic and Gemini clients.
"""
from __future__ import annotations

from relay.convert.common import chunk, error_chunk, new_id, usage_chunk
from relay.convert.responses import (billed_usage, chat_usage_from_doc, compaction_item,
                                     finish_status, message_item, output_text, reasoning_item,
                                     usage_doc, usage_doc_from_chat)
from relay.convert.responses_tools import ToolNames, call_item, custom_input
from relay.convert.responses_upstream import chat_finish

LIFECYCLE = ("response.created", "response.in_progress", "response.queued",
             "response.completed", "response.incomplete", "response.failed")
FINAL = ("response.completed", "response.incomplete", "response.failed")


class ChunksToEvents:
    """Canonical chunks -> Responses events, building the final Response.

    `shell` is the Response object echoing the request (convert.responses
    .response_shell); `names` maps the chat functions back to the request's
    tools (namespaced and custom ones)."""

    def __init__(self, shell: dict, names: ToolNames, prompt_tokens: int = 0,
                 compaction: bool = False):
        self.response = dict(shell)
        # A compaction (a call ending in a compaction_trigger): the model's
        # text is its summary, answered as one compaction item at the end.
        self.compaction = compaction
        self.summary: list[str] = []
        self.names = names
        self.prompt_tokens = prompt_tokens
        self.seq = 0
        self.started = False
        self.output: list[dict] = []
        self.open: dict | None = None     # the item being streamed
        self.text: list[str] = []         # of the open item
        self.tools: dict[int, dict] = {}  # chat tool index -> its item
        self.finish: str | None = None
        self.usage: dict | None = None
        self.done = False

    def _ev(self, kind: str, **fields) -> tuple[str, dict]:
        doc = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, doc

    def _snapshot(self, **changes) -> dict:
        return dict(self.response, output=list(self.output), **changes)

    def _start(self) -> list:
        self.started = True
        snap = self._snapshot()
        return [self._ev("response.created", response=snap),
                self._ev("response.in_progress", response=snap)]

    def _open(self, item: dict) -> list:
        out = self._close()
        self.open = item
        self.text = []
        index = len(self.output)
        item["_index"] = index
        self.output.append(item)
        shown = {k: v for k, v in item.items() if not k.startswith("_")}
        out.append(self._ev("response.output_item.added", output_index=index, item=shown))
        if item["type"] == "message":
            out.append(self._ev("response.content_part.added", item_id=item["id"],
                                output_index=index, content_index=0, part=output_text("")))
        elif item["type"] == "reasoning":
            out.append(self._ev("response.reasoning_summary_part.added", item_id=item["id"],
                                output_index=index, summary_index=0,
                                part={"type": "summary_text", "text": ""}))
        return out

    def _close(self) -> list:
        item, self.open = self.open, None
        if item is None:
            return []
        index = item.pop("_index")
        text = "".join(self.text)
        out = []
        if item["type"] == "message":
            done = message_item(text, item["id"])
            out.append(self._ev("response.output_text.done", item_id=item["id"],
                                output_index=index, content_index=0, text=text, logprobs=[]))
            out.append(self._ev("response.content_part.done", item_id=item["id"],
                                output_index=index, content_index=0, part=output_text(text)))
        elif item["type"] == "reasoning":
            done = reasoning_item(text, item["id"])
            out.append(self._ev("response.reasoning_summary_text.done", item_id=item["id"],
                                output_index=index, summary_index=0, text=text))
            out.append(self._ev("response.reasoning_summary_part.done", item_id=item["id"],
                                output_index=index, summary_index=0,
                                part={"type": "summary_text", "text": text}))
        elif item["type"] == "custom_tool_call":
            raw = custom_input(text)
            done = dict(item, status="completed", input=raw)
            if raw:
                out.append(self._ev("response.custom_tool_call_input.delta", item_id=item["id"],
                                    output_index=index, delta=raw))
            out.append(self._ev("response.custom_tool_call_input.done", item_id=item["id"],
                                output_index=index, input=raw))
        else:
            done = dict(item, status="completed", arguments=text)
            out.append(self._ev("response.function_call_arguments.done", item_id=item["id"],
                                output_index=index, name=item["name"], arguments=text))
        self.output[index] = done
        out.append(self._ev("response.output_item.done", output_index=index, item=done))
        return out

    def _delta(self, kind: str, text: str, content: bool = True) -> tuple[str, dict]:
        item = self.open
        self.text.append(text)
        extra = {"content_index": 0, "logprobs": []} if content else {}
        if kind == "response.reasoning_summary_text.delta":
            extra = {"summary_index": 0}
        return self._ev(kind, item_id=item["id"], output_index=item["_index"], delta=text,
                        **extra)

    def feed(self, doc: dict) -> list[tuple[str, dict]]:
        """One canonical chunk -> 0..n (event name, event) pairs."""
        if self.done:
            return []
        out = [] if self.started else self._start()
        if isinstance(doc.get("error"), dict):
            return out + self.fail(str(doc["error"].get("message") or "The upstream failed."))
        if doc.get("usage"):
            self.usage = doc["usage"]
        for choice in doc.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if (self.open or {}).get("type") != "reasoning":
                    out += self._open(reasoning_item("", new_id("rs_")))
                out.append(self._delta("response.reasoning_summary_text.delta",
                                       delta["reasoning_content"]))
            if delta.get("content") and self.compaction:
                self.summary.append(delta["content"])
            elif delta.get("content"):
                if (self.open or {}).get("type") != "message":
                    out += self._open(message_item("", new_id("msg_"), "in_progress"))
                out.append(self._delta("response.output_text.delta", delta["content"]))
            for tc in delta.get("tool_calls") or ():
                i = tc.get("index", 0)
                fn = tc.get("function") or {}
                if i not in self.tools:
                    item = call_item(tc.get("id") or new_id("call_"), fn.get("name", ""), "",
                                     self.names, status="in_progress")
                    self.tools[i] = item
                    out += self._open(item)
                if not fn.get("arguments") or self.open is not self.tools[i]:
                    continue
                if self.open["type"] == "custom_tool_call":
                    self.text.append(fn["arguments"])  # unwrapped at its close
                else:
                    out.append(self._delta("response.function_call_arguments.delta",
                                           fn["arguments"], content=False))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def end(self) -> list[tuple[str, dict]]:
        """The closing events once the upstream ended cleanly."""
        if self.done:
            return []
        out = [] if self.started else self._start()
        out += self._close()
        if self.compaction:
            item = compaction_item("".join(self.summary))
            index = len(self.output)
            self.output.append(item)
            out += [self._ev("response.output_item.added", output_index=index, item=item),
                    self._ev("response.output_item.done", output_index=index, item=item)]
        self.done = True
        status, details = finish_status(self.finish)
        usage = usage_doc_from_chat(self.usage) or usage_doc(self.prompt_tokens, 0)
        self.response = self._snapshot(status=status, incomplete_details=details, usage=usage)
        if status == "completed":
            self.response["completed_at"] = self.response["created_at"]
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + [self._ev(kind, response=self.response)]

    def fail(self, message: str, code: str = "server_error") -> list[tuple[str, dict]]:
        """The stream broke after it began: response.failed ends it."""
        if self.done:
            return []
        out = [] if self.started else self._start()
        self.done = True
        self.open = None
        self.response = self._snapshot(status="failed", error={"code": code, "message": message},
                                       usage=usage_doc_from_chat(self.usage))
        return out + [self._ev("response.failed", response=self.response)]


class EventsToChunks:
    """Responses events from a Responses-only channel -> canonical chunks."""

    def __init__(self, model: str):
        self.model = model
        self.id = new_id("chatcmpl-")
        self.text_parts: list[str] = []
        self.tools: dict[int, int] = {}  # output_index -> chat tool index
        self.usage = None
        self.final = False

    def _chunk(self, delta=None, finish=None) -> dict:
        return chunk(self.id, self.model, delta, finish)

    def feed(self, data: dict) -> list[dict]:
        kind = data.get("type")
        if kind == "response.created":
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind in ("response.output_text.delta", "response.refusal.delta") and data.get("delta"):
            self.text_parts.append(data["delta"])
            return [self._chunk({"content": data["delta"]})]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta") \
                and data.get("delta"):
            self.text_parts.append(data["delta"])
            return [self._chunk({"reasoning_content": data["delta"]})]
        if kind == "response.output_item.added" and (data.get("item") or {}).get(
                "type") == "function_call":
            item = data["item"]
            n = self.tools[data.get("output_index", 0)] = len(self.tools)
            self.text_parts.append(item.get("name", ""))
            return [self._chunk({"tool_calls": [{
                "index": n, "id": item.get("call_id") or new_id("call_"), "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments")
                             or ""}}]})]
        if kind == "response.function_call_arguments.delta" and data.get("delta"):
            n = self.tools.get(data.get("output_index", 0))
            if n is None:
                return []
            self.text_parts.append(data["delta"])
            return [self._chunk({"tool_calls": [{"index": n,
                                                 "function": {"arguments": data["delta"]}}]})]
        if kind in FINAL:
            resp = data.get("response") or {}
            self.final = True
            self.usage = billed_usage(resp)
            if kind == "response.failed":
                err = resp.get("error") or {}
                return [error_chunk(f"The upstream failed: {err.get('message') or 'unknown'}",
                                    "upstream_error", err.get("code"))]
            out = [self._chunk({}, chat_finish(resp, bool(self.tools)))]
            usage = chat_usage_from_doc(resp.get("usage"))
            if usage:
                out.append(usage_chunk(self.id, self.model, usage))
            return out
        if kind == "error":
            return [error_chunk(f"The upstream failed: {data.get('message')}", "upstream_error",
                                data.get("code"))]
        return []
