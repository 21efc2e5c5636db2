"""What a failed upstream transfer is answered with: libcurl's error numbers
and the reasons relay/upstream/client.py stopped a transfer, as RelayErrors
(status, message, type and code)."""
from __future__ import annotations

from relay.errors import RelayError
from relay.serving.process import out_of_descriptors

# libcurl error codes we tell apart
COULDNT_RESOLVE, COULDNT_CONNECT, OUT_OF_MEMORY, TIMEOUT, ABORTED = 6, 7, 27, 28, 42


def map_reason(reason: str) -> RelayError:
    if reason == "first_byte":
        return RelayError(504, "The upstream did not answer in time.", "upstream_error",
                          "upstream_timeout")
    if reason == "crowded":
        err = RelayError(503, "Too many connections to this upstream are waiting to open; "
                              "retry shortly.", "server_error", "relay_overloaded")
        err.retry_after = 1
        return err
    if reason == "idle":
        return RelayError(504, "The upstream stopped sending mid-stream.", "upstream_error",
                          "upstream_timeout")
    return RelayError(499, "The client closed the request.", "client_closed", "client_closed")


def map_error(code: int, msg: str, status: int) -> RelayError:
    low = msg.lower()
    if code == TIMEOUT:
        if "connect" in low or not status:
            return RelayError(524, "Connecting to the upstream timed out.", "upstream_error",
                              "upstream_connect_timeout")
        return RelayError(504, "The upstream did not answer in time.", "upstream_error",
                          "upstream_timeout")
    if code in (COULDNT_CONNECT, COULDNT_RESOLVE, OUT_OF_MEMORY) and out_of_descriptors():
        # libcurl says "could not connect" (or "out of memory") when it
        # could not even open a socket: our limit, not the upstream's.
        err = RelayError(503, "The relay has no file descriptor left for another upstream "
                              "connection; retry shortly.", "server_error", "relay_overloaded")
        err.retry_after = 1
        return err
    if code in (COULDNT_CONNECT, COULDNT_RESOLVE):
        return RelayError(502, "Could not connect to the upstream.", "upstream_error",
                          "upstream_unreachable")
    return RelayError(502, f"The upstream connection failed: {msg[:200]}", "upstream_error",
                      "bad_upstream")
