"""How long can a hostile notification template delay other requests?

    python bench/template_stall.py [--rounds 10]

Starts a relay (embedded database) on 127.0.0.1, signs in a user, and
previews hostile templates (a template of as many loops as its tag limit allows,
and the nested range loops of issue 10) while another client pings /api/ping.
A control run previews a trivial template with the same requests, so that
on a busy machine the delay the machine adds by itself can be told apart.
Prints the ping delays and writes them to bench/results/template_stall.json.
The promise (README, security): no request is delayed by more than 50 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import stall  # noqa: E402
from tests.helpers import Api, RelayProcess  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        relay = RelayProcess("", tmp).start()
        try:
            admin = Api.login(relay.url)
            figures = stall.report(relay.url, dict(admin.s.headers), args.rounds)
        finally:
            relay.stop()
    print(json.dumps(figures, indent=2))
    out = os.path.join(ROOT, "bench", "results", "template_stall.json")
    with open(out, "w") as fh:
        json.dump(figures, fh, indent=2)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
