#!/usr/bin/env bash
# Refreshes the README's pictures on purpose (a test run never does): runs
# the browser tests, which write every screenshot to the ignored folder
# test-artifacts/tmp/screenshots/, then copies the ones the README shows into
# test-artifacts/screenshots/.  Look at them, then commit them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/run.sh -m browser "$@"
for picture in $(grep -o 'test-artifacts/screenshots/[A-Za-z0-9_.-]*\.png' README.md | sort -u); do
  cp "test-artifacts/tmp/screenshots/$(basename "$picture")" "$picture"
  echo "refreshed $picture"
done
