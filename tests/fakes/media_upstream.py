"""A fake OpenAI upstream that also speaks the media endpoints, on a real socket.

It is FakeOpenAI (same failure modes by path prefix, same request log) plus:

    POST /v1/images/generations    n images as url or b64_json; gpt-image-*
                                   models answer b64_json with token usage
    POST /v1/audio/transcriptions  reads the whole multipart body, measures
                                   the WAV with the stdlib `wave` module (the
                                   other containers: the fixtures, by their
                                   ffprobe lengths) and answers in the asked
                                   response_format (duration only in
                                   verbose_json, two segments, as Whisper writes
                                   them); gpt-4o transcribe models take only
                                   json and text, as OpenAI
    POST /v1/audio/translations    the same, as OpenAI translates: English text,
                                   task "translate", no usage in any format
    POST /v1/images/edits          multipart: 'image' or 'image[]' (PNG only, as
                                   dall-e-2 wants), optional 'mask' (PNG), a
                                   prompt; answers like generations (gpt-image-*:
                                   b64_json and token usage counting the images)
    POST /v1/audio/speech          streams deterministic audio bytes in
                                   chunks, with the format's content type
                                   (fake_real_audio: a real 3.2 s file of the
                                   format); an input containing BREAK_MID_STREAM
                                   resets the connection half way;
                                   stream_format "sse": speech.audio.delta
                                   events and speech.audio.done with usage

Everything an upload carried is kept in `uploads` (fields, file name, size,
sha256, and how the body was framed; for image edits every file part).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import math
import struct
import time
import wave

import tornado.httputil
import tornado.web

from tests.fakes.openai_upstream import FakeOpenAI, _Base, _err
from tests.fakes.server import reset_connection

AUDIO_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def speech_bytes(text: str, size: int) -> bytes:
    """The audio the fake 'speaks' for a text: derived from it, so tests can
    check that every byte came through."""
    seed = hashlib.sha256(text.encode()).digest()
    return (b"ID3" + seed * (size // len(seed) + 1))[:size]


class ImagesHandler(_Base):
    def post(self, mode=None):
        if self._finished:
            return
        b = self.body
        model = b.get("model") or "dall-e-2"
        n = int(b.get("n") or 1)
        if "FORBIDDEN_WORD" in (b.get("prompt") or ""):
            return _err(self, 400, "Your request was rejected as a result of our safety system.",
                        "invalid_request_error", "content_policy_violation")
        b64 = model.startswith("gpt-image") or b.get("response_format") == "b64_json"
        data = []
        for i in range(n):
            if b64:
                data.append({"b64_json": base64.b64encode(PNG_1PX).decode(),
                             "revised_prompt": b.get("prompt")})
            else:
                data.append({"url": f"http://127.0.0.1:{self.fake.port}/files/img-{i}.png",
                             "revised_prompt": b.get("prompt")})
        doc = {"created": int(time.time()), "data": data}
        if model.startswith("gpt-image"):
            doc["usage"] = {"input_tokens": 50, "output_tokens": 1000 * n,
                            "total_tokens": 50 + 1000 * n,
                            "input_tokens_details": {"text_tokens": 50, "image_tokens": 0}}
        self.finish(doc)


@tornado.web.stream_request_body
class TranscriptionHandler(tornado.web.RequestHandler):
    """Reads the body as it arrives, so a test can see an upload flowing
    through the relay before its client has finished sending it."""

    task, verb = "transcribe", "Transcribed"

    def initialize(self, fake):
        self.fake = fake
        self.chunks = []

    def prepare(self):
        self.fake.receiving = 0
        self.fake.requests.append({"method": "POST", "path": self.request.path,
                                   "mode": self.path_kwargs.get("mode") or "ok",
                                   "headers": dict(self.request.headers), "body": {}})

    def data_received(self, chunk):
        self.chunks.append(chunk)
        self.fake.receiving += len(chunk)

    def post(self, mode=None):
        req = self.request
        body = b"".join(self.chunks)
        args, filemap = {}, {}
        tornado.httputil.parse_body_arguments(req.headers.get("Content-Type", ""), body, args,
                                              filemap)
        files = filemap.get("file") or []
        fields = {k: [v.decode() for v in vs] for k, vs in args.items()}
        f = files[0] if files else None
        record = {"fields": fields, "content_length": req.headers.get("Content-Length"),
                  "transfer_encoding": req.headers.get("Transfer-Encoding"),
                  "body_size": len(body), "raw": body}
        if f is not None:
            record.update(filename=f.filename, file_size=len(f.body),
                          sha256=hashlib.sha256(f.body).hexdigest())
        self.fake.uploads.append(record)
        if f is None:
            return _err(self, 400, "Missing required parameter: 'file'.", "invalid_request_error")
        model = (fields.get("model") or [""])[0]
        if not model:
            return _err(self, 400, "you must provide a model parameter", "invalid_request_error")
        seconds = _seconds(f.body, f.filename)
        if seconds is None:
            return _err(self, 400, "Invalid file format. Supported formats: ['flac', 'm4a', "
                                   "'mp3', 'mp4', 'mpeg', 'mpga', 'oga', 'ogg', 'wav', 'webm']",
                        "invalid_request_error")
        text = f"{self.verb} {seconds:.2f} seconds of audio."
        fmt = (fields.get("response_format") or ["json"])[0]
        if "transcribe" in model and fmt not in ("json", "text"):
            return _err(self, 400, f"response_format '{fmt}' is not compatible with model "
                                   f"'{model}'. Use 'json' or 'text'.", "invalid_request_error",
                        "unsupported_value")
        # Whisper cuts speech into segments; a leading space, as it writes them.
        half, words = round(seconds / 2, 2), text.split(" ")
        segments = [{"id": 0, "start": 0.0, "end": half, "text": " " + " ".join(words[:2])},
                    {"id": 1, "start": half, "end": seconds, "text": " " + " ".join(words[2:])}]
        full = text
        if fmt == "verbose_json":
            return self.finish({"task": self.task, "language": "english",
                                "duration": seconds, "text": full, "segments": segments})
        if fmt == "json":
            doc = {"text": full}
            if model.startswith("gpt-4o") and self.task == "transcribe":
                doc["usage"] = {"type": "tokens", "input_tokens": 20, "output_tokens": 10,
                                "total_tokens": 30,
                                "input_token_details": {"text_tokens": 0, "audio_tokens": 20}}
            return self.finish(doc)
        # As Whisper's writers put them: no usage and no duration in these.
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        cues = [(s["start"], s["end"], s["text"].strip().replace("-->", "->")) for s in segments]
        if fmt == "srt":
            return self.finish("".join(f"{i}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{t}\n\n"
                                       for i, (a, b, t) in enumerate(cues, 1)))
        if fmt == "vtt":
            return self.finish("WEBVTT\n\n" + "".join(
                f"{_stamp(a, '.')} --> {_stamp(b, '.')}\n{t}\n\n" for a, b, t in cues))
        self.finish(full + "\n")


class TranslationHandler(TranscriptionHandler):
    task, verb = "translate", "Translated"


class ImageEditHandler(_Base):
    def post(self, mode=None):
        if self._finished:
            return
        req = self.request
        args, filemap = {}, {}
        tornado.httputil.parse_body_arguments(req.headers.get("Content-Type", ""), req.body, args,
                                              filemap)
        fields = {k: [v.decode() for v in vs] for k, vs in args.items()}
        images = (filemap.get("image") or []) + (filemap.get("image[]") or [])
        masks = filemap.get("mask") or []
        self.fake.uploads.append({
            "fields": fields, "content_length": req.headers.get("Content-Length"),
            "transfer_encoding": req.headers.get("Transfer-Encoding"), "body_size": len(req.body),
            "files": [{"name": name, "filename": f.filename, "size": len(f.body),
                       "sha256": hashlib.sha256(f.body).hexdigest()}
                      for name, fs in filemap.items() for f in fs]})
        if not images:
            return _err(self, 400, "Missing required parameter: 'image'.", "invalid_request_error")
        prompt = (fields.get("prompt") or [""])[0]
        if not prompt:
            return _err(self, 400, "Missing required parameter: 'prompt'.", "invalid_request_error")
        if any(not f.body.startswith(b"\x89PNG") for f in images + masks):
            return _err(self, 400, "Invalid input image - format must be in ['png'].",
                        "invalid_request_error", "invalid_image_format")
        if "FORBIDDEN_WORD" in prompt:
            return _err(self, 400, "Your request was rejected as a result of our safety system.",
                        "invalid_request_error", "content_policy_violation")
        model = (fields.get("model") or ["dall-e-2"])[0]
        n = int((fields.get("n") or ["1"])[0])
        b64 = model.startswith("gpt-image") or fields.get("response_format") == ["b64_json"]
        data = [{"b64_json": base64.b64encode(PNG_1PX).decode()} if b64 else
                {"url": f"http://127.0.0.1:{self.fake.port}/files/edit-{i}.png"} for i in range(n)]
        doc = {"created": int(time.time()), "data": data}
        if model.startswith("gpt-image"):
            # Input images are billed as image tokens, as OpenAI reports them.
            image_tokens = 65 * len(images)
            doc["usage"] = {"input_tokens": 20 + image_tokens, "output_tokens": 1000 * n,
                            "total_tokens": 20 + image_tokens + 1000 * n,
                            "input_tokens_details": {"text_tokens": 20,
                                                     "image_tokens": image_tokens}}
        self.finish(doc)


def _seconds(data: bytes, filename: str) -> float | None:
    """The audio's length: WAV by the stdlib, the compressed containers by
    ffprobe's own numbers for the fixtures (tests/fixtures/audio), looked up
    by content, so that the fake does not share the relay's readers."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            return w.getnframes() / float(w.getframerate())
    except (wave.Error, EOFError):
        pass
    return FIXTURE_SECONDS.get(hashlib.sha256(data).hexdigest())


# sha256 of each fixture -> its length as ffprobe reports it (filled at import).
FIXTURE_SECONDS: dict[str, float] = {}


def _load_fixtures() -> None:
    import glob
    import json as _json
    import os
    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "audio")
    try:
        lengths = _json.load(open(os.path.join(here, "lengths.json")))
    except OSError:
        return
    for name, secs in lengths.items():
        for path in glob.glob(os.path.join(here, name)):
            FIXTURE_SECONDS[hashlib.sha256(open(path, "rb").read()).hexdigest()] = secs


_load_fixtures()


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


class SpeechHandler(_Base):
    async def post(self, mode=None):
        if self._finished:
            return
        b = self.body
        text = b.get("input") or ""
        fmt = b.get("response_format") or "mp3"
        audio = speech_bytes(text, self.fake.speech_bytes_per_char * len(text))
        if b.get("fake_real_audio"):   # the 3.2 s tone, a real file of the asked format
            audio = fixture_audio(fmt)
        if b.get("stream_format") == "sse":
            # OpenAI's speech events: audio deltas, then speech.audio.done with usage.
            self.set_header("Content-Type", "text/event-stream")
            for i in range(0, len(audio), 4096):
                delta = base64.b64encode(audio[i:i + 4096]).decode()
                self.write("data: " + json.dumps({"type": "speech.audio.delta", "audio": delta})
                           + "\n\n")
                await self.flush()
            usage = {"input_tokens": len(text) // 4 + 1, "output_tokens": SSE_AUDIO_TOKENS,
                     "total_tokens": len(text) // 4 + 1 + SSE_AUDIO_TOKENS}
            self.write("data: " + json.dumps({"type": "speech.audio.done", "usage": usage})
                       + "\n\n")
            return self.finish()
        self.set_header("Content-Type", AUDIO_TYPES.get(fmt, "audio/mpeg"))
        step = 4096
        for i in range(0, len(audio), step):
            if "BREAK_MID_STREAM" in text and i >= len(audio) // 2:
                reset_connection(self)
                return
            self.write(audio[i:i + step])
            await self.flush()
            await asyncio.sleep(0)
        self.finish()


# What the fake's speech.audio.done reports as the audio written.
SSE_AUDIO_TOKENS = 777


def fixture_audio(fmt: str) -> bytes:
    import os
    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "audio")
    return open(os.path.join(here, f"tone.{'wav' if fmt == 'pcm' else fmt}"), "rb").read()


class FakeMedia(FakeOpenAI):
    def __init__(self, slow_delay: float = 0.5, speech_bytes_per_char: int = 300):
        super().__init__(slow_delay)
        self.uploads: list[dict] = []
        self.receiving = 0  # bytes of the transcription upload in progress so far
        self.speech_bytes_per_char = speech_bytes_per_char
        self.extra_handlers = [("/images/generations", ImagesHandler),
                               ("/audio/transcriptions", TranscriptionHandler),
                               ("/audio/translations", TranslationHandler),
                               ("/images/edits", ImageEditHandler),
                               ("/audio/speech", SpeechHandler)]


def make_wav(seconds: float, rate: int = 8000, channels: int = 1) -> bytes:
    """A real WAV file of a 440 Hz tone, made with the stdlib `wave` module."""
    frames = int(seconds * rate)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        samples = bytearray()
        for i in range(frames):
            v = int(8000 * math.sin(2 * math.pi * 440 * i / rate))
            samples += struct.pack("<h", v) * channels
        w.writeframes(bytes(samples))
    return buf.getvalue()
