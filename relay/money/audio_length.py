"""How long an audio file is, read by maintained libraries rather than by
hand: mutagen for the containers it knows (MP3, MP4/M4A, AAC (ADTS), Ogg
Vorbis/Opus/FLAC/Speex, FLAC, WAVE, AIFF, ASF, ...), enzyme for Matroska
and WebM (mutagen has no reader for them).

Used to bill transcriptions by time when the upstream reports neither
usage nor duration.  seconds_of() reads a file object (the upload's spool,
relay/upstream/upload.py) and may take milliseconds: callers run it on a
thread.  None when the format is unknown or says nothing of its length (a
WebM recorded live carries no duration).
"""
from __future__ import annotations

import logging

log = logging.getLogger("relay.money.audio_length")

_MATROSKA = b"\x1a\x45\xdf\xa3"  # the EBML magic that starts Matroska and WebM


def seconds_of(fileobj, content_type: str = "") -> float | None:
    """The length in seconds of the audio in `fileobj` (read, seek, tell;
    `name`, the client's file name, helps mutagen tell AAC from others)."""
    try:
        fileobj.seek(0)
        head = fileobj.read(4)
        fileobj.seek(0)
        if head == _MATROSKA or "webm" in content_type or "matroska" in content_type:
            return _matroska(fileobj)
        return _mutagen(fileobj)
    except Exception as exc:  # a file a library cannot read is a file of unknown length
        log.debug("audio length unreadable: %s", exc)
        return None


def _mutagen(fileobj) -> float | None:
    import mutagen
    got = mutagen.File(fileobj)
    length = getattr(getattr(got, "info", None), "length", None)
    return float(length) if length and length > 0 else None


def _matroska(fileobj) -> float | None:
    import enzyme
    mkv = enzyme.MKV(fileobj)
    duration = mkv.info.duration if mkv.info is not None else None
    return duration.total_seconds() if duration and duration.total_seconds() > 0 else None
