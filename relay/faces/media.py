"""The OpenAI face for media: images (generations and edits), speech,
transcriptions and translations.

Same shape as relay/faces/openai.py (parse_*, StreamWriter, render), with
one difference: speech is a binary stream, not server-sent events, so the
StreamWriter here passes the upstream's bytes through untouched and answers
with the upstream's own content type.

Billing units (`call.extra["units"]`, what pricing.cost multiplies a call
price by):
    images          n, the number of images asked for (generations and edits)
    speech          characters of `input`; the audio written is billed as output
                    tokens from the upstream's usage (stream_format "sse"), else
                    from its length (relay/adaptors/openai_speech.py BinaryStream)
    transcriptions  seconds of audio, rounded up: the upstream's duration, else read
    translations    from the file (relay/money/audio_length.py), else 1 (per call);
                    token usage, when reported, is billed per token
A transcription asked for as text, srt or vtt is asked of the upstream as
verbose_json (json for the gpt-4o transcribe models, which have no other),
which carries the duration or the usage, and rendered here in the asked
format as the vendor writes it (render_transcript).
Image edits, transcriptions and translations are multipart uploads that
stream through (relay/upstream/upload.py); their fields are checked here twice: the
ones known when the call starts, and all of them before the upload ends.

What is reserved (relay/bounds.py) comes from here too: an upload's bytes
bound the seconds of audio in it (no codec a client may send goes below
MIN_AUDIO_BYTES_PER_SECOND), and so its tokens; an image is at most
IMAGE_OUTPUT_TOKENS; speech at most SPEECH_TOKENS_PER_CHAR a character,
slowed by `speed`.
"""
from __future__ import annotations

import math
import re

from relay.adaptors.base import Call, Chunk
from relay.errors import bad_request
from relay.faces.openai import load_json, render, require_model  # noqa: F401  (render: same as OpenAI's)

FAMILY = "openai"

IMAGE_FORMATS = ("url", "b64_json")
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
TRANSLATION_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
# OpenAI's default model for image edits when the field is left out.
IMAGE_EDIT_DEFAULT_MODEL = "dall-e-2"
# OpenAI's own limits; checked here so that a bad call costs nothing.
MAX_IMAGES = 10
MAX_EDIT_IMAGES = 16
MAX_SPEECH_CHARS = 4096
# gpt-image-1's dearest image (1536x1024, high quality) is 6,240 output tokens.
IMAGE_OUTPUT_TOKENS = 6_240
# Opus, the leanest codec the vendors take (in Ogg or WebM), at its lowest rate:
# 6 kbit/s.  Bytes / this >= the seconds of audio.
MIN_AUDIO_BYTES_PER_SECOND = 750
# Audio tokens a second of speech in (gpt-4o transcribe models bill about 17)
# and text tokens out (nobody speaks ten a second): bounds, not estimates.
AUDIO_IN_TOKENS_PER_SECOND = 25
TEXT_OUT_TOKENS_PER_SECOND = 10
# A character takes at most this many audio tokens to say at speed 1 (about
# 15 characters a second, 21 tokens a second: 1.4; slow instructions aside).
SPEECH_TOKENS_PER_CHAR = 4
# Transcripts asked for as text, srt or vtt are asked of the upstream as
# verbose_json, but for these models, whose only other format is json.
JSON_ONLY_TRANSCRIBERS = re.compile(r"transcribe")


def _number(doc: dict, name: str, low: float, high: float, integer: bool = False):
    value = doc.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise bad_request(f"'{name}' must be {kind} from {low:g} to {high:g}.", "invalid_value",
                          name)
    return int(value) if integer else value


def parse_images(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    prompt = doc.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad_request("'prompt' must be a non-empty string.", "missing_prompt", "prompt")
    model = doc.get("model")
    if model is None:
        # OpenAI's default when the field is left out.
        model = doc["model"] = "dall-e-2"
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' must be a non-empty string.", "missing_model", "model")
    n = _number(doc, "n", 1, MAX_IMAGES, integer=True) or 1
    fmt = doc.get("response_format")
    if fmt is not None and fmt not in IMAGE_FORMATS:
        raise bad_request("'response_format' must be 'url' or 'b64_json'.", "invalid_value",
                          "response_format")
    for name in ("size", "quality", "style", "background", "output_format"):
        if name in doc and doc[name] is not None and not isinstance(doc[name], str):
            raise bad_request(f"'{name}' must be a string.", "invalid_value", name)
    if doc.get("stream"):
        raise bad_request("Streamed image generation is not supported; leave out 'stream'.",
                          "unsupported_value", "stream")
    return Call(request_id=request_id, endpoint="images", face=FAMILY, model=model, body=doc,
                raw=raw, native_body=doc,
                extra={"units": n, "reserve_output": n * IMAGE_OUTPUT_TOKENS})


def parse_speech(request_id: str, raw: bytes) -> Call:
    doc = load_json(raw)
    model = require_model(doc)
    text = doc.get("input")
    if not isinstance(text, str) or not text:
        raise bad_request("'input' must be a non-empty string.", "missing_input", "input")
    if len(text) > MAX_SPEECH_CHARS:
        raise bad_request(f"'input' is {len(text)} characters; the limit is {MAX_SPEECH_CHARS}.",
                          "string_above_max_length", "input")
    voice = doc.get("voice")
    if not (isinstance(voice, str) and voice.strip()) and not (isinstance(voice, dict) and voice):
        raise bad_request("'voice' must name a voice.", "missing_voice", "voice")
    fmt = doc.get("response_format")
    if fmt is not None and fmt not in SPEECH_FORMATS:
        raise bad_request(f"'response_format' must be one of {', '.join(SPEECH_FORMATS)}.",
                          "invalid_value", "response_format")
    speed = _number(doc, "speed", 0.25, 4.0) or 1
    sse = doc.get("stream_format")
    if sse is not None and sse not in ("audio", "sse"):
        raise bad_request("'stream_format' must be 'audio' or 'sse'.", "invalid_value",
                          "stream_format")
    # Speech is always relayed as a stream: the audio goes out as it comes in.
    out = math.ceil(len(text) * SPEECH_TOKENS_PER_CHAR / min(speed, 1))
    return Call(request_id=request_id, endpoint="speech", face=FAMILY, model=model, body=doc,
                raw=raw, native_body=doc, stream=True,
                extra={"units": len(text), "reserve_output": out})


def audio_bound(length: int | None, max_bytes: int) -> dict:
    """What an audio upload of `length` bytes (None: chunked, up to the body
    limit) can be billed at most: seconds, and tokens in and out."""
    secs = math.ceil((length if length is not None else max_bytes) / MIN_AUDIO_BYTES_PER_SECOND)
    return {"reserve_units": max(secs, 1), "reserve_prompt": secs * AUDIO_IN_TOKENS_PER_SECOND,
            "reserve_output": secs * TEXT_OUT_TOKENS_PER_SECOND}


def upstream_format(name: str, value: str, fields: dict) -> str:
    """The response_format the upstream is asked for (upload rewrite hook):
    text, srt and vtt carry neither usage nor duration."""
    if name != "response_format" or value not in ("text", "srt", "vtt"):
        return value
    if value == "text" and JSON_ONLY_TRANSCRIBERS.search(fields.get("model") or ""):
        return "json"
    return "verbose_json"


def render_transcript(doc: dict, fmt: str) -> str:
    """A transcript asked for as text, srt or vtt, from the verbose_json (or
    json) the upstream answered, written as OpenAI writes them (Whisper's
    writers: the text and a newline; numbered SRT cues with hours and a
    comma; a WEBVTT header, then cues with hours and a point; each cue's
    text stripped, "-->" made "->")."""
    if fmt == "text":
        return str(doc.get("text") or "") + "\n"
    segments = doc.get("segments")
    if not isinstance(segments, list) or not segments:
        segments = [{"start": 0.0, "end": float(doc.get("duration") or 0),
                     "text": str(doc.get("text") or "")}]
    cues = []
    for i, seg in enumerate(s for s in segments if isinstance(s, dict)):
        text = str(seg.get("text") or "").strip().replace("-->", "->")
        start, end = _stamp(seg.get("start"), fmt), _stamp(seg.get("end"), fmt)
        cues.append((f"{i + 1}\n" if fmt == "srt" else "") + f"{start} --> {end}\n{text}\n\n")
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "".join(cues)


def _stamp(seconds, fmt: str) -> str:
    ms = round(float(seconds or 0) * 1000)
    sep = "," if fmt == "srt" else "."
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def check_transcription_fields(fields: dict, final: bool = False,
                               formats: tuple = TRANSCRIPT_FORMATS) -> None:
    """Validate the small fields of a transcription upload (the file aside)."""
    fmt = fields.get("response_format")
    if fmt is not None and fmt not in formats:
        raise bad_request(f"'response_format' must be one of {', '.join(formats)}.",
                          "invalid_value", "response_format")
    temp = fields.get("temperature")
    if temp is not None:
        try:
            ok = 0 <= float(temp) <= 1
        except ValueError:
            ok = False
        if not ok:
            raise bad_request("'temperature' must be a number from 0 to 1.", "invalid_value",
                              "temperature")


def check_translation_fields(fields: dict, final: bool = False) -> None:
    check_transcription_fields(fields, final, TRANSLATION_FORMATS)


def check_image_edit_fields(fields: dict, final: bool = False) -> None:
    """Validate the text fields of an image edit upload.  `final`: all of
    them have arrived (a prompt may follow the images)."""
    if final and not (fields.get("prompt") or "").strip():
        raise bad_request("'prompt' must be a non-empty string.", "missing_prompt", "prompt")
    image_edit_count(fields)
    fmt = fields.get("response_format")
    if fmt is not None and fmt not in IMAGE_FORMATS:
        raise bad_request("'response_format' must be 'url' or 'b64_json'.", "invalid_value",
                          "response_format")
    if (fields.get("stream") or "").strip().lower() in ("true", "1"):
        raise bad_request("Streamed image edits are not supported; leave out 'stream'.",
                          "unsupported_value", "stream")


def image_edit_count(fields: dict) -> int:
    """The number of images an edit asks for (the billing unit): 'n', 1 by default."""
    raw = fields.get("n")
    if raw is None or raw == "":
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_IMAGES:
        raise bad_request(f"'n' must be a whole number from 1 to {MAX_IMAGES}.", "invalid_value",
                          "n")
    return n


class StreamWriter:
    """Binary pass-through: the upstream's bytes, its content type, no framing."""

    def __init__(self, call: Call):
        self.call = call

    def headers(self, upstream) -> dict:
        """The reply headers, given the upstream's (None if it sent none)."""
        ctype = upstream.get("Content-Type") if upstream is not None else None
        return {"Content-Type": ctype or "application/octet-stream", "Cache-Control": "no-cache"}

    def write(self, chunk: Chunk) -> bytes:
        return chunk.raw or b""

    def finish(self) -> bytes:
        return b""

    def error(self, status: int, message: str) -> bytes:
        # Audio has no way to carry an error; the handler cuts the connection
        # instead, so the client sees a truncated body, not a clean end.
        return b""
