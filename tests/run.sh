#!/usr/bin/env bash
# Installs what the tests need (Debian's Chromium and ChromeDriver for the
# browser tests, the Python packages) and runs the whole suite.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
need=""
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v chromedriver >/dev/null 2>&1 || need="$need chromium-driver"
command -v wrk >/dev/null 2>&1 || need="$need wrk"
if [ -n "$need" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
fi
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# The coding-agent CLIs and Node SDKs the end-to-end tests drive (tests/clients).
npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
# Store fidelity (issue 9): the suite below runs it against the embedded
# default; here it runs against SecantusDB too, as a separate process.
python3 -m tests.fidelity_on secantus
exec python3 -m pytest "$@"
