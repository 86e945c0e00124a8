#!/usr/bin/env bash
# Write constraints.txt from the project's venv after a green test run: the versions it passed with.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
{
  echo "# The versions the test suite last passed with (pip freeze of .venv, py-spy and sparkfleet left out)."
  echo "# scripts/setup.sh installs the project's venv with -c constraints.txt, so a fresh machine gets these"
  echo "# and not whatever was newest that day; regenerate after a green run: scripts/freeze-constraints.sh"
  "$root/.venv/bin/pip" freeze --exclude-editable | grep -v -i -e '^py-spy' -e '^sparkfleet'
} > "$root/constraints.txt"
