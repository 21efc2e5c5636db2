"""A multipart upload (audio to transcribe or translate, images to edit) on
its way to the upstream.

The handler feeds the client's body in as it arrives, and python-multipart's
streaming parser (the one Starlette uses) reads it.  What the upstream gets
is the form as that parser read it, written anew: one part per field it
reported, under a boundary of our own, so that no second parser can read
the client's bytes another way (a second `model` part, kept by an upstream
that keeps the last, would run a model the relay neither authorised nor
billed).  A non-file field given twice (but array fields, `name[]`) and
more file parts than the endpoint takes are a 400 naming the field.  A
field the relay asks of the upstream differently (a transcription's
response_format, see `rewrite`) is written with the relay's value, once the
model is known; the client's stays in `fields`.

Every part goes to a spool file as it arrives, not into memory, and the
upstream reads from that file as it fills, so the upload flows through
while the client is still sending.  The spool also makes a retry on another
channel possible: it starts again from byte one.  The model field is left
out of the spool and written per attempt as the first part, with the
channel's own model name.  The upstream's length is known only once the
client's body is: an upload still arriving goes as chunked.

The main file's bytes are spooled in place, so its length in seconds is read
from the spool when the body is complete (relay/money/audio_length.py), on
a thread, before the upstream sees the end of the body.
"""
from __future__ import annotations

import asyncio
import math
import os
import secrets
import tempfile
from typing import Callable

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from relay.errors import bad_request
from relay.money import audio_length

FIELD_LIMIT = 64 * 1024     # a text field (prompt) bigger than this is refused
HEADER_LIMIT = 16 * 1024    # the headers of one part
MAX_PARTS = 64              # fields and files in one form


def boundary_of(content_type: str, what: str = "the audio in a 'file' field") -> bytes:
    """The multipart boundary, or a 400 naming what is wrong."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request(f"The request must be multipart/form-data with {what}.",
                          "invalid_content_type")
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary", b"")
    if not boundary or len(boundary) > 200:
        raise bad_request("The multipart Content-Type has no boundary.", "invalid_content_type")
    return boundary


class UploadPipe:
    """Bytes for the upstream, spooled to a file, read by upstream attempts."""

    def __init__(self):
        self._file = tempfile.TemporaryFile(prefix="relay-upload-")
        self._fd = self._file.fileno()
        self.written = 0
        self.ended = False
        self.aborted = False
        self._wakers: list[Callable[[], None]] = []

    def write(self, data: bytes) -> None:
        if not data or self.aborted:
            return
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, self.written)
            self.written += n
            view = view[n:]
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def abort(self) -> None:
        self.aborted = True
        self._wake()

    def read_at(self, pos: int, size: int) -> bytes:
        return os.pread(self._fd, max(min(size, self.written - pos), 0), pos)

    def _wake(self) -> None:
        for wake in list(self._wakers):
            wake()

    def close(self) -> None:
        self.aborted = True
        self._wakers.clear()
        self._file.close()


class Producer:
    """One attempt's view of the upload: a prefix, then the spool."""

    def __init__(self, pipe: UploadPipe, prefix: bytes, length: int | None):
        self.pipe = pipe
        self.prefix = prefix
        self.length = length
        self.pos = 0  # in the spool

    @property
    def aborted(self) -> bool:
        return self.pipe.aborted

    def start(self, wake: Callable[[], None]) -> None:
        self.pipe._wakers[:] = [wake]  # an earlier attempt is over
        self.pos = 0

    def read(self, size: int) -> bytes | None:
        if self.prefix:
            out, self.prefix = self.prefix[:size], self.prefix[size:]
            return out
        if self.pos < self.pipe.written:
            data = self.pipe.read_at(self.pos, size)
            self.pos += len(data)
            return data
        return b"" if self.pipe.ended else None


class _SpoolFile:
    """A read-only file over one part's bytes in the spool (for mutagen)."""

    def __init__(self, pipe: UploadPipe, start: int, size: int, name: str):
        self.pipe, self.start, self.size, self.name, self.pos = pipe, start, size, name, 0

    def read(self, n: int = -1) -> bytes:
        left = self.size - self.pos
        n = left if n is None or n < 0 else min(n, left)
        data = self.pipe.read_at(self.start + self.pos, n) if n > 0 else b""
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(base + offset, 0)
        return self.pos

    def tell(self) -> int:
        return self.pos


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "")


class MultipartUpload:
    """Parses a multipart/form-data body as it streams past (see module doc).

    `file_fields` names the parts that carry the main file (at least one is
    required; the first found is `file`), `what` describes it in errors,
    `file_limits` says how many file parts each name may have (by default
    one main file and nothing else), and `rewrite(name, value, fields)`
    gives the value the upstream gets for a field (called once the model is
    known).  feed() and finish() raise RelayError(400) for a malformed body.
    """

    def __init__(self, content_type: str, length: int | None, file_fields=("file",),
                 what: str = "the audio", file_limits: dict | None = None, rewrite=None):
        self.file_fields = tuple(file_fields)
        self.what = what
        self.file_limits = file_limits or {self.file_fields[0]: 1}
        boundary_of(content_type, f"{what} in the '{self.file_fields[0]}' field")
        self.client_length = length
        self.boundary = b"relay-" + secrets.token_hex(16).encode()
        self.content_type = "multipart/form-data; boundary=" + self.boundary.decode()
        self.pipe = UploadPipe()
        self.fields: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.rewrite = rewrite
        self._pending: list[tuple[str, str]] = []  # fields waiting for the model
        self.file: dict | None = None   # name, filename, content_type, size, start
        self.file_done = False
        self.seconds: float | None = None
        self.ended = False
        self._files: dict[str, int] = {}
        self._parts = 0
        self._part: dict | None = None
        self._header_name = b""
        self._header_value = b""
        self._finished = False
        self._parser = MultipartParser(boundary_of(content_type, what), callbacks={
            "on_part_begin": self._on_part_begin, "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value, "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished, "on_part_data": self._on_data,
            "on_part_end": self._on_part_end, "on_end": self._on_end},
            max_header_size=HEADER_LIMIT)

    # ---- what the handler and the adaptor see ---------------------------------
    @property
    def model(self) -> str | None:
        return self.fields.get("model")

    @property
    def ready(self) -> bool:
        """Enough is known to start the upstream call: the model, and the
        file has begun."""
        return bool(self.model) and self.file is not None

    def audio_seconds(self) -> float | None:
        """The audio's length read from the file by measure(), or None."""
        return self.seconds

    def units(self) -> int:
        secs = self.seconds
        return max(math.ceil(secs), 1) if secs else 1

    async def measure(self) -> float | None:
        """Read the main file's length in seconds (complete files only), on
        a thread: a container's index can take milliseconds to walk."""
        if self.file is None or not self.file_done:
            return None
        f = self.file
        spool = _SpoolFile(self.pipe, f["start"], f["size"], f["filename"] or "")
        self.seconds = await asyncio.get_running_loop().run_in_executor(
            None, audio_length.seconds_of, spool, f["content_type"])
        return self.seconds

    def producer(self, upstream_model: str) -> Producer:
        """The body for one upstream attempt, its model field set to
        `upstream_model`."""
        prefix = self._field("model", upstream_model)
        length = self.pipe.written + len(prefix) if self.ended else None
        return Producer(self.pipe, prefix, length)

    def _field(self, name: str, value: str) -> bytes:
        return (b"--" + self.boundary + f'\r\nContent-Disposition: form-data; name="'
                f'{_quote(name)}"\r\n\r\n'.encode() + value.encode() + b"\r\n")

    # ---- parsing ----------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        try:
            self._parser.write(data)
        except MultipartParseError as exc:
            raise bad_request(f"The multipart body is malformed: {exc}.",
                              "invalid_multipart") from None

    def finish(self, check=None, default_model: str | None = None) -> None:
        """The client's body is complete.  `check(fields)` validates the
        fields (raising RelayError) before the upstream may see the end of
        the body: once it has, a refusal could no longer stop a charge.
        `default_model` stands in for a missing model field.  The end is
        written by end(), after measure()."""
        if not self._finished:
            raise bad_request("The multipart body ended before its closing boundary.",
                              "invalid_multipart")
        if self.file is None:
            field = self.file_fields[0]
            raise bad_request(f"The upload has no '{field}' field with {self.what}.",
                              "missing_file", field)
        if not self.model and default_model:
            self.fields["model"] = default_model
            self._flush_pending()
        if not self.model:
            raise bad_request("You must provide a model parameter.", "missing_model", "model")
        if check is not None:
            check(self.fields)

    def end(self) -> None:
        """Let the upstream read the end of the form."""
        self.pipe.write(b"--" + self.boundary + b"--\r\n")
        self.ended = True
        self.pipe.end()

    def _on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise bad_request(f"The form has more than {MAX_PARTS} parts.", "invalid_multipart")
        self._part = {"name": None, "filename": None, "content_type": "", "value": bytearray(),
                      "file": False}

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        name, value = self._header_name.strip().lower(), self._header_value.strip()
        self._header_name = self._header_value = b""
        part = self._part
        if name == b"content-disposition":
            kind, params = parse_options_header(value)
            if kind != b"form-data" or b"name" not in params:
                raise bad_request("A multipart part has no form-data name.", "invalid_multipart")
            part["name"] = _text(params[b"name"], "a field name")
            if b"filename" in params:
                part["filename"] = _text(params[b"filename"], "a file name")
        elif name == b"content-type":
            part["content_type"] = _text(value, "a content type")

    def _on_headers_finished(self) -> None:
        part = self._part
        name = part["name"]
        if name is None:
            raise bad_request("A multipart part has no Content-Disposition.", "invalid_multipart")
        if part["filename"] is not None:
            count = self._files.get(name, 0) + 1
            limit = self.file_limits.get(name, 0)
            if count > limit:
                raise bad_request(
                    f"The upload has more than {limit} file(s) in the field '{name}'."
                    if limit else f"The field '{name}' does not take a file.",
                    "too_many_files" if limit else "unexpected_file", name)
            self._files[name] = count
            part["file"] = True
            head = f'--{self.boundary.decode()}\r\nContent-Disposition: form-data; name="' \
                   f'{_quote(name)}"; filename="{_quote(part["filename"])}"\r\n'
            if part["content_type"]:
                head += f"Content-Type: {part['content_type']}\r\n"
            self.pipe.write((head + "\r\n").encode())
            if name in self.file_fields and self.file is None:
                self.file = {"name": name, "filename": part["filename"],
                             "content_type": part["content_type"], "size": 0,
                             "start": self.pipe.written}
                part["main"] = True
        elif name.endswith("[]"):
            pass
        elif name in self.fields or name in self.arrays:
            raise bad_request(f"The field '{name}' is given more than once.", "duplicate_field",
                              name)

    def _on_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        if part["file"]:
            self.pipe.write(data[start:end])
            if part.get("main"):
                self.file["size"] += end - start
            return
        if len(part["value"]) + end - start > FIELD_LIMIT:
            raise bad_request(f"The field '{part['name']}' is larger than "
                              f"{FIELD_LIMIT // 1024} KB.", "field_too_large", part["name"])
        part["value"] += data[start:end]

    def _on_part_end(self) -> None:
        part, self._part = self._part, None
        name = part["name"]
        if part["file"]:
            self.pipe.write(b"\r\n")
            if part.get("main"):
                self.file_done = True
            return
        try:
            value = bytes(part["value"]).decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request(f"The field '{name}' is not UTF-8 text.", "invalid_multipart",
                              name) from None
        if name.endswith("[]"):
            self.arrays.setdefault(name, []).append(value)
        else:
            self.fields[name] = value
        if name == "model":
            self._flush_pending()
        elif self.model or self.rewrite is None:
            self._spool_field(name, value)
        else:
            self._pending.append((name, value))

    def _spool_field(self, name: str, value: str) -> None:
        if self.rewrite is not None:
            value = self.rewrite(name, value, self.fields)
        self.pipe.write(self._field(name, value))

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for name, value in pending:
            self._spool_field(name, value)

    def _on_end(self) -> None:
        self._finished = True

    def close(self) -> None:
        self.pipe.close()


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(f"A multipart part has {what} that is not UTF-8.",
                          "invalid_multipart") from None


__all__ = ["MultipartUpload", "UploadPipe", "Producer", "boundary_of"]
