"""How long an audio file is, from its first bytes (and its size when known).

Used to bill transcriptions by time when the upstream does not report the
duration (any response_format but verbose_json).  Pure functions, no I/O.
Formats: WAV (RIFF PCM), MP3 (a Xing/Info frame count, else constant bit
rate from the first frame), FLAC (STREAMINFO).  Anything else -> None: the
call is then billed as one unit (per call).
"""
from __future__ import annotations

import struct

_MP3_RATES = {  # (MPEG version bits, bitrate index) -> kbit/s, Layer III
    3: [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
    2: [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
}
_MP3_SAMPLE_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def seconds(head: bytes, file_size: int | None = None) -> float | None:
    """The length in seconds, or None when the format is unknown or its
    header is not complete in `head`."""
    for fn in (wav_seconds, flac_seconds, mp3_seconds):
        value = fn(head, file_size)
        if value is not None:
            return value
    return None


def header_complete(head: bytes) -> bool:
    """Whether more bytes could still change what seconds() says."""
    if len(head) < 12:
        return False
    if head[:4] in (b"RIFF", b"fLaC") or head[:3] == b"ID3" or _mp3_frame(head, 0):
        return seconds(head) is not None
    return True  # a format we do not read: nothing more to learn


def wav_seconds(head: bytes, file_size: int | None = None) -> float | None:
    """A declared data size of 0 or 0xFFFFFFFF (streamed WAVs), or one larger
    than what was really sent, is replaced by what was sent, when known."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(head):
        cid, size = head[pos:pos + 4], struct.unpack("<I", head[pos + 4:pos + 8])[0]
        if cid == b"fmt ":
            if pos + 8 + 16 > len(head):
                return None
            byte_rate = struct.unpack("<I", head[pos + 16:pos + 20])[0]
        elif cid == b"data":
            if not byte_rate:
                return None
            data = size
            if file_size is not None:
                sent = max(file_size - (pos + 8), 0)
                if data in (0, 0xFFFFFFFF) or data > sent:
                    data = sent
            return data / byte_rate
        pos += 8 + size + (size & 1)
    return None


def flac_seconds(head: bytes, file_size: int | None = None) -> float | None:
    # "fLaC", then the STREAMINFO block: 4-byte block header, 34 bytes.
    if len(head) < 42 or head[:4] != b"fLaC":
        return None
    info = head[8:42]
    packed = int.from_bytes(info[10:18], "big")
    rate = packed >> 44
    total = packed & ((1 << 36) - 1)
    if not rate or not total:
        return None
    return total / rate


def _mp3_frame(head: bytes, pos: int):
    """(version bits, kbit/s, sample rate, mono) of a Layer III frame header
    at `pos`, or None."""
    if pos + 4 > len(head) or head[pos] != 0xFF or head[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2, b3 = head[pos + 1], head[pos + 2], head[pos + 3]
    version, layer = (b1 >> 3) & 3, (b1 >> 1) & 3
    rate_idx, sr_idx = b2 >> 4, (b2 >> 2) & 3
    if version == 1 or layer != 1 or rate_idx in (0, 15) or sr_idx == 3:
        return None
    kbps = _MP3_RATES[3 if version == 3 else 2][rate_idx]
    return version, kbps, _MP3_SAMPLE_RATES[version][sr_idx], (b3 >> 6) == 3


def mp3_seconds(head: bytes, file_size: int | None = None) -> float | None:
    pos = 0
    if head[:3] == b"ID3":
        if len(head) < 10:
            return None
        size = 0
        for b in head[6:10]:
            size = (size << 7) | (b & 0x7F)
        pos = 10 + size
    frame = _mp3_frame(head, pos)
    if frame is None:
        return None
    version, kbps, rate, mono = frame
    per_frame = 1152 if version == 3 else 576
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    xing = pos + 4 + side
    if head[xing:xing + 4] in (b"Xing", b"Info") and len(head) >= xing + 12:
        flags = struct.unpack(">I", head[xing + 4:xing + 8])[0]
        if flags & 1:
            frames = struct.unpack(">I", head[xing + 8:xing + 12])[0]
            return frames * per_frame / rate
    if file_size is None:
        return None  # constant bit rate: the length comes with the size
    return max(file_size - pos, 0) * 8 / (kbps * 1000)
