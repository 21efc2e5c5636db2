"""A multipart upload (audio to transcribe or translate, images to edit) on
its way to the upstream.

The handler feeds the client's body in as it arrives.  We read just enough
of it on the way past: the small text fields (model, language, prompt, ...),
the file's name and type, and for audio the first bytes of the file (a WAV
header gives the audio's length, see relay/money/audio_length.py).  Every byte goes to a spool file as it arrives,
not into memory, and the upstream reads from that file as it fills, so the
upload flows through while the client is still sending.  The spool also
makes a retry on another channel possible: it starts again from byte one.

The model field is the one part we change: it is left out of the spool and
written per attempt as the first part, with the channel's own model name
(channels may map model names).
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from typing import Callable

from relay.money import audio_length
from relay.errors import bad_request

FIELD_LIMIT = 64 * 1024     # a text field (prompt) bigger than this is refused
HEADER_LIMIT = 16 * 1024    # the headers of one part
SNIFF_BYTES = 64 * 1024     # of the file, kept to find the WAV header


def boundary_of(content_type: str, what: str = "the audio in a 'file' field") -> bytes:
    """The multipart boundary, or a 400 naming what is wrong."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request(f"The request must be multipart/form-data with {what}.",
                          "invalid_content_type")
    m = re.search(r'boundary="?([^";]+)"?', content_type, re.I)
    if not m or len(m.group(1)) > 200:
        raise bad_request("The multipart Content-Type has no boundary.", "invalid_content_type")
    return m.group(1).encode("latin-1")


class UploadPipe:
    """Bytes from our client, spooled to a file, read by upstream attempts."""

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
        return os.pread(self._fd, min(size, self.written - pos), pos)

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


class MultipartUpload:
    """Parses a multipart/form-data body as it streams past (see module doc).

    `file_fields` names the parts that carry the main file (the first one
    found is `file`; at least one is required), `what` describes it in
    errors, and `sniff` keeps the file's first bytes (audio length).
    feed() and finish() raise RelayError(400) for a malformed body.
    """

    def __init__(self, content_type: str, length: int | None, file_fields=("file",),
                 what: str = "the audio", sniff: bool = True):
        self.file_fields = tuple(file_fields)
        self.what = what
        self.sniff = sniff
        self.boundary = boundary_of(content_type, f"{what} in the '{self.file_fields[0]}' field")
        self.content_type = content_type
        self.client_length = length
        self.pipe = UploadPipe()
        self.fields: dict[str, str] = {}
        self.file: dict | None = None   # name, filename, content_type, size
        self.file_done = False
        self._head = bytearray()
        self._delim = b"\r\n--" + self.boundary
        # A made-up CRLF before the body makes the first boundary look like
        # every other one; it is never passed on.
        self._buf = bytearray(b"\r\n")
        self._vpos = 0
        self._state = "preamble"
        self._part: dict | None = None
        self._held = b""              # a part's boundary and headers, until we know its name
        self._dropped = 0             # real bytes left out of the spool
        self._model_dropped = False
        self._lead_crlf: bool | None = None
        self.ended = False

    # ---- what the handler and the adaptor see ---------------------------------
    @property
    def model(self) -> str | None:
        return self.fields.get("model") if self._model_dropped else None

    @property
    def ready(self) -> bool:
        """Enough is known to start the upstream call: the model, and the
        file's header (or the whole file) when its length is read from it."""
        return bool(self.model) and self.file is not None and (
            not self.sniff or self.file_done or len(self._head) >= SNIFF_BYTES
            or audio_length.header_complete(bytes(self._head)))

    def audio_seconds(self) -> float | None:
        """The audio's length read from the file (relay/money/audio_length.py), or None."""
        if self.file is None:
            return None
        return audio_length.seconds(bytes(self._head),
                                    self.file["size"] if self.file_done else None)

    def units(self) -> int:
        secs = self.audio_seconds()
        return max(math.ceil(secs), 1) if secs else 1

    def producer(self, upstream_model: str) -> Producer:
        """The body for one upstream attempt, its model field set to `upstream_model`."""
        part = (b"--" + self.boundary + b'\r\nContent-Disposition: form-data; name="model"'
                b"\r\n\r\n" + upstream_model.encode())
        if not self._lead_crlf:
            part += b"\r\n"
        length = None
        if self.client_length is not None:
            length = self.client_length - self._dropped + len(part)
        return Producer(self.pipe, part, length)

    # ---- parsing ----------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self._buf += data
        self._parse()

    def finish(self, check=None, default_model: str | None = None) -> None:
        """The client's body is complete.  `check(fields)` validates the
        fields (raising RelayError) before the upstream may see the end of
        the body: once it has, a refusal could no longer stop a charge.
        `default_model` stands in for a missing model field."""
        self._parse()
        if self._state != "epilogue":
            raise bad_request("The multipart body ended before its closing boundary.",
                              "invalid_multipart")
        if self._buf:
            self._pass(bytes(self._buf), keep=True)
            self._buf.clear()
        if self.file is None:
            field = self.file_fields[0]
            raise bad_request(f"The upload has no '{field}' field with {self.what}.",
                              "missing_file", field)
        if not self.model and default_model and "model" not in self.fields:
            # The model part is written per attempt anyway (producer()).
            self.fields["model"] = default_model
            self._model_dropped = True
        if not self.model:
            raise bad_request("You must provide a model parameter.", "missing_model", "model")
        if check is not None:
            check(self.fields)
        self.ended = True
        self.pipe.end()

    def _pass(self, data: bytes, keep: bool) -> None:
        start = self._vpos
        self._vpos += len(data)
        skip = max(0, 2 - start)
        real = data[skip:]
        if not real:
            return
        if keep:
            if self._lead_crlf is None:
                self._lead_crlf = real.startswith(b"\r\n")
            self.pipe.write(real)
        else:
            self._dropped += len(real)

    def _parse(self) -> None:
        d = self._delim
        while True:
            buf = self._buf
            if self._state == "epilogue":
                if buf:
                    self._pass(bytes(buf), keep=True)
                    buf.clear()
                return
            if self._state in ("preamble", "body"):
                i = buf.find(d)
                end = i if i >= 0 else max(len(buf) - len(d) + 1, 0)
                if end:
                    self._content(bytes(buf[:end]))
                    del buf[:end]
                if i < 0:
                    return
                if self._part is not None:
                    self._end_part()
                self._state = "delim"
                continue
            if self._state == "delim":
                if len(buf) < len(d) + 2:
                    return
                tail = bytes(buf[len(d):len(d) + 2])
                if tail == b"--":
                    self._pass(bytes(buf[:len(d) + 2]), keep=True)
                    del buf[:len(d) + 2]
                    self._state = "epilogue"
                    continue
                j = buf.find(b"\r\n\r\n", len(d))
                if j < 0:
                    if len(buf) > HEADER_LIMIT:
                        raise bad_request("A multipart part has headers that are too large.",
                                          "invalid_multipart")
                    return
                held = bytes(buf[:j + 4])
                del buf[:j + 4]
                self._start_part(held, held[len(d):].decode("utf-8", "replace"))
                self._state = "body"

    def _start_part(self, held: bytes, header_text: str) -> None:
        disp = ""
        ctype = ""
        for line in header_text.split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                disp = value
            elif name.strip().lower() == "content-type":
                ctype = value.strip()
        name = _param(disp, "name")
        filename = _param(disp, "filename")
        part = {"name": name, "filename": filename, "value": bytearray(), "file": False}
        if name == "model" and filename is None and not self._model_dropped:
            part["drop"] = True
            self._pass(held, keep=False)
        else:
            part["drop"] = False
            self._pass(held, keep=True)
        if name in self.file_fields and filename is not None and self.file is None:
            part["file"] = True
            self.file = {"name": name, "filename": filename, "content_type": ctype, "size": 0}
        self._part = part

    def _content(self, data: bytes) -> None:
        part = self._part
        if part is None:  # the preamble: meaningless, left out
            self._pass(data, keep=False)
            return
        self._pass(data, keep=not part["drop"])
        if part["file"]:
            self.file["size"] += len(data)
            room = SNIFF_BYTES - len(self._head) if self.sniff else 0
            if room > 0:
                self._head += data[:room]
        elif part["filename"] is None:
            if len(part["value"]) + len(data) > FIELD_LIMIT:
                raise bad_request(f"The field '{part['name']}' is larger than "
                                  f"{FIELD_LIMIT // 1024} KB.", "field_too_large", part["name"])
            part["value"] += data

    def _end_part(self) -> None:
        part, self._part = self._part, None
        if part["file"]:
            self.file_done = True
        elif part["filename"] is None and part["name"]:
            try:
                value = bytes(part["value"]).decode("utf-8")
            except UnicodeDecodeError:
                raise bad_request(f"The field '{part['name']}' is not UTF-8 text.",
                                  "invalid_multipart", part["name"]) from None
            if part["drop"]:
                self._model_dropped = True
                self.fields["model"] = value
            elif part["name"] not in self.fields:
                self.fields[part["name"]] = value

    def close(self) -> None:
        self.pipe.close()


def _param(header: str, key: str) -> str | None:
    m = re.search(r';\s*' + key + r'\*?="((?:[^"\\]|\\.)*)"', header, re.I) or \
        re.search(r';\s*' + key + r'=([^;\s]+)', header, re.I)
    return m.group(1) if m else None


__all__ = ["MultipartUpload", "UploadPipe", "Producer", "boundary_of"]
