#!/usr/bin/env bash
# The README's test command: set everything up, then run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not e2e").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
"$here/setup.sh" all
# Each must succeed: a missing piece fails here, loudly, rather than as skipped tests later.
for extra in start-slurm.sh setup-browser.sh setup-nfs.sh; do
  "$here/$extra"
done
cd "$root"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/mypy
.venv/bin/lint-imports
# The 30 slowest tests are listed at the end: where CI's time goes.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
