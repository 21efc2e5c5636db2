"""Run the store fidelity suite against SecantusDB, started here as a
separate process (it is GPL-2.0: run, never imported).

    python3 -m tests.fidelity_on secantus [pytest args]

tests/run.sh does this in CI; the embedded default gets the same suite as
part of the whole run.  Any server at all: RELAY_TEST_MONGO_URL=... pytest.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from models.embedded import secantus_command
from tests.helpers import ROOT, free_port, wait_port


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "secantus":
        print(__doc__, file=sys.stderr)
        return 2
    where = tempfile.mkdtemp(prefix="fidelity-secantus-")
    port = free_port()
    server = subprocess.Popen(secantus_command(where, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_port(port, server, what="secantusd-py")
        env = dict(os.environ, RELAY_TEST_MONGO_URL=f"mongodb://127.0.0.1:{port}/?directConnection=true")
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                                "tests/models/test_store_fidelity.py", *argv[1:]], cwd=ROOT, env=env)
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
