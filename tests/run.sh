#!/usr/bin/env bash
# Installs what the tests need and runs the whole suite (the README's second
# command; .ci/run calls it).  Extra arguments go to pytest, e.g.
# `bash tests/run.sh -m "not slow"`.
#
# Python packages go into the project's virtual environment .venv (the
# README's first command makes the same one): Debian's python3 is "externally
# managed" (PEP 668) and refuses system-wide installs.  The venv is made
# --without-pip and filled by the system's pip (`pip --python`), so Debian's
# python3-venv package (ensurepip) is not needed; it is installed only if
# even that fails.  Debian packages: Chromium and its driver, fonts for the
# pages they render, wrk, npm and pip when missing.  No `ps` or sudo needed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Root installs directly; anyone else through sudo if there is one.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "tests/run.sh: needs root for: $* (run it as root, or install those packages first)" >&2
    return 1
  fi
}
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  echo "tests/run.sh: apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }

need=""
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v chromedriver >/dev/null 2>&1 || need="$need chromium-driver"
command -v wrk >/dev/null 2>&1 || need="$need wrk"
# The Claude Code tests trace the CLI's connections to prove it stays on 127.0.0.1.
command -v strace >/dev/null 2>&1 || need="$need strace"
# Chromium only recommends fonts; without any, pages render as boxes.
installed fonts-liberation || need="$need fonts-liberation"
installed fonts-dejavu-core || need="$need fonts-dejavu-core"
# The Chinese console (tests/ui/test_console_zh.py): a small CJK font, 1.6 MB.
installed fonts-wqy-microhei || need="$need fonts-wqy-microhei"
command -v npm >/dev/null 2>&1 || need="$need npm"
python3 -m pip --version >/dev/null 2>&1 || need="$need python3-pip"
if [ -n "$need" ]; then
  apt_install $need
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv --without-pip .venv || { apt_install python3-venv && python3 -m venv --without-pip .venv; }
fi
if .venv/bin/python -m pip --version >/dev/null 2>&1; then
  pip=(.venv/bin/python -m pip)  # a venv made with its own pip
else
  pip=(python3 -m pip --python .venv/bin/python)
fi
"${pip[@]}" install -q --disable-pip-version-check -r requirements-test.txt
# The coding-agent CLIs and Node SDKs the end-to-end tests drive (tests/clients).
npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
# Store fidelity (issue 9): the suite below runs it against the embedded
# default; here it runs against SecantusDB too, as a separate process, at
# the same time as the suite (it mostly waits on its server), its report
# printed after the suite's.
echo "tests/run.sh: installs done in ${SECONDS}s"
installed_at=$SECONDS
fidelity_log=$(mktemp)
.venv/bin/python -m tests.fidelity_on secantus >"$fidelity_log" 2>&1 &
fidelity=$!
# The suite runs in worker processes (pytest-xdist), each with its own
# database server, relays and fakes on free ports: most tests wait on
# time (flush intervals, processes starting) rather than on a core.  A
# module stays on one worker (--dist loadfile): its relay and fixtures are
# started once; the longest modules go first (tests/conftest.py,
# LONGEST_FIRST).  RELAY_TEST_WORKERS=0 runs it in this one process; a `-n`
# given here wins over both.
status=0
# --durations: CI's log names the slowest tests, for the next look at the budget.
.venv/bin/python -m pytest -n "${RELAY_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder \
  --durations=30 "$@" || status=$?
echo "tests/run.sh: suite done in $((SECONDS - installed_at))s"
wait "$fidelity" || { echo "tests/run.sh: the store fidelity suite on SecantusDB failed" >&2; status=1; }
echo "---- store fidelity on SecantusDB (tests/fidelity_on.py) ----"
cat "$fidelity_log"
rm -f "$fidelity_log"
echo "tests/run.sh: ${SECONDS}s in all"
exit "$status"
