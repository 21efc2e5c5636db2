"""A pass-through stream reader beside the converting one, fed alike."""
from __future__ import annotations


def fed_alike(passing, converting, events: list[bytes], at: float) -> tuple[list, list]:
    """Each event fed to both readers as an upstream sends it, a chunk an
    event, cut in two at `at` of its length.  Returns what each made, its
    finish() included; the passing reader's chunks must hold the bytes as
    they came, and no chunk."""
    written = []
    for ev in events:
        cut = int(len(ev) * at)
        for piece in (ev[:cut], ev[cut:]):
            written += passing.feed(piece)
            converting.feed(piece)
    written += passing.finish()
    made = converting.finish()
    assert b"".join(c.raw for c in written) == b"".join(events)  # byte for byte
    assert all(c.data is None for c in written)                    # and no chunk made
    return written, made


def stream_call(face: str, model: str):
    """A streamed chat call of `face`, its model not renamed."""
    from relay.adaptors.base import Call
    call = Call(request_id="r", endpoint="chat", face=face, model=model, body={}, raw=b"{}",
                native_body={}, stream=True)
    call.upstream_model = model
    return call
