"""Speech (POST /v1/audio/speech) from OpenAI-format upstreams: the audio
passes through as it comes, and what it is billed by is read on the way."""
from __future__ import annotations

import asyncio
import json
import math
import tempfile
from dataclasses import replace

from relay.adaptors.base import Call, Chunk, StreamReader
from relay.convert.openai_usage import usage_from
from relay.money import audio_length, tokenizer
from relay.money.pricing import Usage
from relay.serving import sse

# OpenAI prices gpt-4o-mini-tts at $12 per million audio tokens and "about
# $0.015 a minute": 1,250 tokens a minute of audio written.
TTS_TOKENS_PER_MINUTE = 1_250
# An event ends at a blank line.
_EVENT_END = b"\n\n"


class BinaryStream(StreamReader):
    """Speech: the upstream's bytes pass through as they are.  Billed: the
    input (characters as units, and its tokens) and the audio written, as
    output tokens: the upstream's own count where it gives one (stream_format
    "sse": speech.audio.done carries usage), else from the length of the
    audio (measure(), after the stream: the audio is kept in a spool file
    on the way past, up to MAX_KEPT)."""

    MAX_KEPT = 64 * 1024 * 1024
    # OpenAI's pcm (and the data of its wav): 24 kHz, 16-bit, mono.
    PCM_BYTES_PER_SECOND = 48_000

    def __init__(self, call: Call):
        super().__init__()
        self.call = call
        self.sse = call.body.get("stream_format") == "sse"
        self.size = 0
        self.reported: Usage | None = None
        self._tail = b""
        self._spool = None if self.sse else tempfile.SpooledTemporaryFile(1024 * 1024)

    def feed(self, data: bytes) -> list[Chunk]:
        self.size += len(data)
        if self.sse:
            self._scan(data)
        elif self._spool is not None and self.size <= self.MAX_KEPT:
            self._spool.write(data)
        return [Chunk(None, data)]

    def _scan(self, data: bytes) -> None:
        """Finds the usage in the events (the last, speech.audio.done)."""
        buf = self._tail + data
        end = buf.rfind(_EVENT_END) + 2 if _EVENT_END in buf else 0
        self._tail = buf[end:] if len(buf) - end <= self.MAX_KEPT else b""
        if end and b'"usage"' in buf[:end]:
            for ev in sse.SSEParser().feed(buf[:end]):
                try:
                    doc = json.loads(ev.data)
                except ValueError:
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("usage"), dict):
                    self.reported = usage_from(doc["usage"])

    def _text_tokens(self) -> int:
        b = self.call.body
        return sum(tokenizer.count_text(b[k], self.call.model) for k in ("input", "instructions")
                   if isinstance(b.get(k), str))

    def finish(self) -> list[Chunk]:
        units = int(self.call.extra.get("units") or 1)
        u = self.reported
        if u is not None:  # every output token of speech is audio
            self.usage = replace(u, units=units, audio_output_tokens=u.completion_tokens)
        else:
            self.usage = Usage(prompt_tokens=self._text_tokens(), units=units)
        return []

    async def measure(self) -> Usage | None:
        """The usage with the audio written, from its length when the
        upstream did not count it; on a thread (a container's index)."""
        usage = self.usage or Usage(prompt_tokens=self._text_tokens(),
                                    units=int(self.call.extra.get("units") or 1))
        if self.reported is not None or self._spool is None or not self.size:
            return usage
        fmt = self.call.body.get("response_format") or "mp3"
        if fmt in ("pcm", "wav"):
            secs = max(self.size - (44 if fmt == "wav" else 0), 0) / self.PCM_BYTES_PER_SECOND
        else:
            secs = await asyncio.get_running_loop().run_in_executor(
                None, audio_length.seconds_of, self._spool, "")
        self._spool.close()
        self._spool = None
        if not secs:
            return usage
        tokens = math.ceil(secs * TTS_TOKENS_PER_MINUTE / 60)
        return replace(usage, completion_tokens=tokens, audio_output_tokens=tokens,
                       estimated=True)
