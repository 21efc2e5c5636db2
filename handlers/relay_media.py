"""OpenAI media routes (images, image edits, speech, transcriptions,
translations), and every OpenAI-family route under the base-address
variants clients produce (a doubled /v1, a chat URL given as the base).

Every route also answers without the /v1 prefix and with a trailing slash;
double slashes are collapsed by the application before routing.
"""
from __future__ import annotations

import asyncio
import json

from tornado.iostream import StreamClosedError

from handlers.relay_base import RelayHandler
from handlers.relay_openai import (BillingSubscriptionHandler, BillingUsageHandler, ChatHandler,
                                   CompletionsHandler, EmbeddingsHandler, ModelsHandler,
                                   ModerationsHandler, RerankHandler, _OpenAIRelay)
from relay.adaptors.base import Call
from relay.errors import RelayError
from relay.faces import media
from relay.upstream.upload import MultipartUpload


class ImagesHandler(_OpenAIRelay):
    parse = staticmethod(media.parse_images)


class SpeechHandler(RelayHandler):
    """Audio streams back as the upstream sends it, in its content type."""

    async def post(self) -> None:
        auth = await self.auth()
        call = media.parse_speech(self.request_id, self.body)
        out = await self.ctx["service"].relay(call, auth, self, media, self.cancel)
        if out.error is not None and self.started:
            # Half an audio file must not look like a whole one: what came
            # is sent, then the connection is cut instead of ending the
            # chunked body cleanly.
            if not self.closed:
                try:
                    await self.flush()
                except StreamClosedError:
                    pass
            self.request.connection.close()
            return
        if out.error is not None:
            return self.send_error_body(out.error)
        if not self.closed:
            self.finish()


class _UploadHandler(RelayHandler):
    """A multipart upload that streams to the upstream while it arrives.

    prepare() authenticates before a byte of the body is read; the call
    starts (channel, reservation, upstream connection) as soon as the model
    field and the file's header have gone past, and post() - which Tornado
    calls once the body is complete - waits for its answer.  Subclasses say
    which endpoint, which file fields, and how the fields are checked and
    billed.
    """

    buffer_body = False
    endpoint = ""
    file_fields = ("file",)
    file_limits = {"file": 1}
    what = "the audio"
    rewrite = staticmethod(media.upstream_format)
    default_model = None
    check = staticmethod(media.check_transcription_fields)

    def bound(self, upload: MultipartUpload) -> dict:
        """What the call may cost at most, from the upload's size (call.extra)."""
        return media.audio_bound(upload.client_length, self.config.max_body_bytes)

    def units(self, upload: MultipartUpload) -> dict:
        """The billing facts known once the whole upload is in (call.extra)."""
        return {"units": upload.units(), "audio_seconds": upload.audio_seconds()}

    def initialize(self) -> None:
        super().initialize()
        self.upload: MultipartUpload | None = None
        self.task: asyncio.Future | None = None
        self.failed: RelayError | None = None
        self.call: Call | None = None

    async def prepare(self) -> None:
        await super().prepare()
        # The size limit is ours to enforce (data_received), so that a chunked
        # body over it gets a 413 instead of Tornado dropping the connection.
        self.request.connection.set_max_body_size(1 << 62)
        self.auth_ = await self.auth()
        length = self.request.headers.get("Content-Length")
        self.upload = MultipartUpload(self.request.headers.get("Content-Type", ""),
                                      int(length) if length and length.isdigit() else None,
                                      self.file_fields, self.what, self.file_limits,
                                      self.rewrite)

    def data_received(self, chunk: bytes) -> None:
        # Errors are kept for post(): raising here would drop the connection
        # without an answer.
        if self.failed is not None or self.upload is None:
            return
        self._size += len(chunk)
        if self._size > self.config.max_body_bytes:
            self._fail(RelayError(413, f"The request body is larger than the limit of "
                                       f"{self.config.max_body_mb} MB.", "invalid_request_error",
                                  "request_too_large"))
            # Answer now: Tornado reads no more of the body and closes the
            # connection once the answer is out.
            self.send_error_body(self.failed)
            return
        try:
            self.upload.feed(chunk)
            if self.task is None and self.upload.ready:
                self._start()
        except RelayError as err:
            self._fail(err)

    def _fail(self, err: RelayError) -> None:
        self.failed = err
        if self.upload is not None:
            self.upload.pipe.abort()

    def _start(self) -> None:
        up = self.upload
        fields = dict(up.fields)
        self.check(fields)
        self.call = Call(request_id=self.request_id, endpoint=self.endpoint, face="openai",
                         model=up.model, body=fields, extra={"upload": up, **self.bound(up)})
        self.task = asyncio.ensure_future(
            self.ctx["service"].relay(self.call, self.auth_, self, media, self.cancel))
        self.task.add_done_callback(self._relay_done)

    def _relay_done(self, task: asyncio.Future) -> None:
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, RelayError) and self.failed is None:
            self.failed = exc  # refused before anything was sent (quota, model, channel)
        if self.upload is not None and exc is not None:
            self.upload.pipe.abort()

    async def post(self) -> None:
        if self.failed is None:
            try:
                self.upload.finish(lambda fields: self.check(fields, True), self.default_model)
            except RelayError as err:
                self._fail(err)
        if self.failed is None:
            # The whole upload is here: the real facts, for the bill, before
            # the upstream sees its end (and may answer).  A call not begun
            # yet begins with the whole body, and so with its length.
            up = self.upload  # on_finish lets go of it if the client leaves meanwhile
            await up.measure()
            if self.upload is None and self.task is None:
                return  # the client left before anything began
            if self.task is None and self.failed is None:
                up.end()
                try:
                    self._start()
                except RelayError as err:
                    self._fail(err)
            if self.call is not None:
                self.call.extra.update(self.units(up))
            if self.failed is None and not up.ended:
                up.end()
        asked = (self.upload.fields if self.upload is not None else {}).get("response_format")
        if self.task is not None:
            try:
                out = await self.task
            except RelayError as err:
                out = None
                self.failed = self.failed or err
            if self.failed is None and out is not None:
                if out.error is not None:
                    return self.send_error_body(out.error)
                if asked in ("text", "srt", "vtt") and isinstance(out.body, dict):
                    # Asked of the upstream as verbose_json (or json): written here.
                    self.set_header("Content-Type", "text/plain; charset=utf-8")
                    return self.finish(media.render_transcript(out.body, asked))
                ctype = (out.headers or {}).get("Content-Type", "application/json")
                self.set_header("Content-Type", ctype)
                if out.raw is not None:
                    return self.finish(out.raw)
                # Not passed through as bytes (e.g. a mapped model): text,
                # srt and vtt answers were kept as {"text": ...}.
                if "json" in ctype:
                    return self.finish(json.dumps(media.render(self.call, out.body),
                                                  ensure_ascii=False))
                return self.finish(str((out.body or {}).get("text", "")))
        raise self.failed

    def on_connection_close(self) -> None:
        super().on_connection_close()
        if self.upload is not None:
            self.upload.pipe.abort()
        self.on_finish()  # Tornado calls on_finish only for finished requests

    def on_finish(self) -> None:
        upload, self.upload = self.upload, None
        if upload is None:
            return
        if self.task is None or self.task.done():
            upload.close()
        else:
            self.task.add_done_callback(lambda _t: upload.close())


class TranscriptionHandler(_UploadHandler):
    endpoint = "transcriptions"


class TranslationHandler(_UploadHandler):
    """Speech in any language to English text; billed like transcriptions."""

    endpoint = "translations"
    check = staticmethod(media.check_translation_fields)


class ImageEditHandler(_UploadHandler):
    """One or more images ('image' or the SDK's 'image[]'), an optional
    mask and a prompt; billed per image asked for ('n')."""

    endpoint = "image_edits"
    file_fields = ("image", "image[]")
    # gpt-image-1 takes up to 16 images, and one mask.
    file_limits = {"image": media.MAX_EDIT_IMAGES, "image[]": media.MAX_EDIT_IMAGES, "mask": 1}
    what = "the image"
    rewrite = None
    default_model = media.IMAGE_EDIT_DEFAULT_MODEL
    check = staticmethod(media.check_image_edit_fields)

    def bound(self, upload: MultipartUpload) -> dict:
        n = media.image_edit_count(upload.fields)
        size = upload.client_length or self.config.max_body_bytes
        return {"units": n, "reserve_output": n * media.IMAGE_OUTPUT_TOKENS,
                "reserve_prompt": size}

    def units(self, upload: MultipartUpload) -> dict:
        return {"units": media.image_edit_count(upload.fields)}


# ---- routes -----------------------------------------------------------------
# Chat front ends are often given ".../v1/chat/completions" as their base and
# append "/chat/completions" to it; others double the "/v1".  Any run of
# "/v1" and "/chat/completions" before a known endpoint is accepted.
_P = r"(?:/v1|/chat/completions)*"

default_handlers = [
    (_P + r"/chat/completions/?", ChatHandler),
    (_P + r"/embeddings/?", EmbeddingsHandler),
    (_P + r"/completions/?", CompletionsHandler),
    (_P + r"/moderations/?", ModerationsHandler),
    (_P + r"/rerank/?", RerankHandler),
    (_P + r"/models/?", ModelsHandler),
    # Model ids with ':' (Ollama's "qwen2.5:7b", fine-tuned "ft:...:id") that
    # the Gemini "{model}:{method}" route (earlier in the table) left over.
    (_P + r"/models/(?P<model>[^?]+?)/?", ModelsHandler),
    (_P + r"/images/generations/?", ImagesHandler),
    (_P + r"/audio/speech/?", SpeechHandler),
    (_P + r"/audio/transcriptions/?", TranscriptionHandler),
    (_P + r"/audio/translations/?", TranslationHandler),
    (_P + r"/images/edits/?", ImageEditHandler),
    (_P + r"/dashboard/billing/subscription/?", BillingSubscriptionHandler),
    (_P + r"/dashboard/billing/usage/?", BillingUsageHandler),
]
