#!/usr/bin/env bash
# What the dashboard's browser tests (tests/dashboard) need, idempotently: Debian's `chromium`
# and the PyPI `playwright` driver in the project's venv. Playwright's own browser download is
# never used (tests launch /usr/bin/chromium), so nothing is fetched beyond apt and PyPI.
# Usage: scripts/setup-browser.sh      (PYTHON=/path/to/python to install elsewhere than .venv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PLAYWRIGHT_SPEC="playwright>=1.40,<2"  # pyproject.toml's `browser` extra (tests/unit checks they agree)

if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  echo "setup-browser: chromium present"
else
  echo "setup-browser: installing chromium"
  stamp=/var/lib/sparkfleet/apt-updated
  if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
    $SUDO apt-get update -qq
    $SUDO mkdir -p /var/lib/sparkfleet && $SUDO touch "$stamp"
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
fi

py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || { echo "setup-browser: FAILED: $py missing (run scripts/setup.sh first, or set PYTHON)" >&2; exit 1; }
if "$py" -c "import playwright.sync_api" 2>/dev/null; then
  echo "setup-browser: playwright present in $py"
else
  echo "setup-browser: installing $PLAYWRIGHT_SPEC into $py"
  # pip's own exit status decides (a filter on its output must not hide a failed install).
  if ! out="$("$py" -m pip install -q -c "$root/constraints.txt" "$PLAYWRIGHT_SPEC" 2>&1)"; then
    printf '%s\n' "$out" | tail -30 >&2
    echo "setup-browser: FAILED: pip install $PLAYWRIGHT_SPEC into $py" >&2
    exit 1
  fi
  printf '%s\n' "$out" | grep -v -e '^WARNING: Running pip as' -e '^WARNING: Location' -e '^$' || :
  "$py" -c "import playwright.sync_api" \
    || { echo "setup-browser: FAILED: playwright installed but does not import in $py" >&2; exit 1; }
fi
[ -x /usr/bin/chromium ] || { echo "setup-browser: FAILED: /usr/bin/chromium missing after install" >&2; exit 1; }
