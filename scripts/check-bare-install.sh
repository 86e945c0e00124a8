#!/usr/bin/env bash
# A bare install (`pip install <repo>`, no extras) must answer every user mistake with exit code 2
# and one line on stderr, never a traceback: the dev venv hides missing dependencies (its extras pull
# in click, matplotlib, starlette …), so this builds a fresh venv with nothing but the package.
#
#   scripts/check-bare-install.sh            # PYTHON=python3.12 to pick the interpreter
#
# Prints one line per case and exits non-zero when any case fails. Wheels are kept in
# ~/.cache/sparkfleet/wheels (SPARKFLEET_WHEEL_CACHE): a run within a day of the last index
# resolution installs from there; without a cache, or when installing from it fails, or with
# SPARKFLEET_BARE_REFRESH=1, pip resolves against its index as a user's `pip install` would.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python3}"
cache="${SPARKFLEET_WHEEL_CACHE:-$HOME/.cache/sparkfleet/wheels}"

work="$(mktemp -d "${TMPDIR:-/tmp}/sparkfleet-bare.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# pip builds a local project in place (build/, *.egg-info); a copy keeps the checkout untouched,
# and copying only what git tracks (or would track) keeps .venv and caches out of it.
mkdir -p "$work/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -xf - -C "$work/src"
else
  tar -C "$root" --exclude=./.venv --exclude=./build --exclude='*.egg-info' -cf - . | tar -xf - -C "$work/src"
fi

if ! "$python" -m venv "$work/venv" >"$work/venv.log" 2>&1; then
  cat "$work/venv.log" >&2
  echo "FAIL  could not create a venv with $python" >&2
  exit 1
fi
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check)
# Installing from the wheel cache alone takes half the time of resolving against the index, but a
# cache must not hide a new upstream release (typer 0.29 dropping click is what this check is
# for): it is used only within a day of the last index resolution.
stamp="$cache/.resolved"
how=""
if [ "${SPARKFLEET_BARE_REFRESH:-0}" != 1 ] && [ -f "$stamp" ] && [ -z "$(find "$stamp" -mmin +1440)" ] &&
   "${pip[@]}" install --no-index --find-links "$cache" "$work/src" >"$work/pip.log" 2>&1; then
  how="from the wheel cache $cache (index resolution $(date -r "$stamp" '+%F %H:%M'))"
fi
if [ -z "$how" ]; then
  find_links=()
  if [ -d "$cache" ]; then find_links=(--find-links "$cache"); fi
  if ! "${pip[@]}" install "${find_links[@]}" "$work/src" >"$work/pip.log" 2>&1; then
    tail -n 30 "$work/pip.log" >&2
    echo "FAIL  pip install $root (no extras)" >&2
    exit 1
  fi
  how="resolved against the package index"
  # Refill the cache with exactly what was installed, plus the build backend; failing here only
  # costs time on the next run.
  if mkdir -p "$cache" 2>/dev/null &&
     "${pip[@]}" freeze --exclude sparkfleet >"$work/reqs.txt" &&
     "$work/venv/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
       "$work/src/pyproject.toml" >>"$work/reqs.txt" &&
     "${pip[@]}" download -q -d "$cache" -r "$work/reqs.txt" >"$work/cache.log" 2>&1; then
    touch "$stamp"
  fi
fi
echo "installed sparkfleet without extras, $how"

bin="$work/venv/bin/sparkfleet"
export SPARKFLEET_STATE_DIR="$work/state"  # nothing reads or writes the user's state
export COLUMNS=100                          # the one-line rule must not depend on the terminal
cd "$root" || exit 1

failures=0
total=0

# check NAME EXPECT_RC KIND [NEEDLE] -- ARGS...
#   KIND "mistake": exit EXPECT_RC, stderr exactly one non-empty line (holding NEEDLE if given)
#   KIND "ok":      exit EXPECT_RC, something on stdout
check() {
  local name="$1" want="$2" kind="$3" needle="$4"
  shift 5
  total=$((total + 1))
  "$bin" "$@" >"$work/out" 2>"$work/err" </dev/null
  local rc=$? problem=""
  local lines
  lines="$(wc -l <"$work/err" | tr -d ' ')"
  # On stdout only a line that starts like Python's traceback counts: a plan's JSON legitimately
  # quotes "Traceback (most recent call last)" as a forbidden boot-log line.
  if grep -q "Traceback" "$work/err" || grep -q "^Traceback" "$work/out"; then problem="traceback"; fi
  if [ "$rc" != "$want" ]; then problem="${problem:+$problem, }exit $rc, want $want"; fi
  if [ "$kind" = mistake ]; then
    # "one line": one newline-terminated line that holds text (rich ends it with a newline).
    if [ "$lines" != 1 ] || ! grep -q '[^[:space:]]' "$work/err"; then
      problem="${problem:+$problem, }stderr has $lines line(s)"
    fi
    if [ -n "$needle" ] && ! grep -qF -- "$needle" "$work/err"; then
      problem="${problem:+$problem, }stderr lacks '$needle'"
    fi
    shown="$(head -n 1 "$work/err")"
  else
    if [ ! -s "$work/out" ]; then problem="${problem:+$problem, }nothing on stdout"; fi
    shown="stdout $(wc -l <"$work/out" | tr -d ' ') lines"
  fi
  if [ -n "$problem" ]; then
    failures=$((failures + 1))
    printf 'FAIL  %-34s exit %s: %s\n' "$name" "$rc" "$problem"
    sed 's/^/        | /' "$work/err" | head -n 20
  else
    printf 'ok    %-34s exit %s  %s\n' "$name" "$rc" "$shown"
  fi
}

spark4=examples/clusters/spark4.toml
check "--help" 0 ok "" -- --help
check "no arguments (help)" 0 ok "" --
check "unknown command" 2 mistake "bogus" -- bogus
check "missing argument" 2 mistake "Missing argument" -- plan
check "unknown option" 2 mistake "--bogus" -- plan --bogus
check "unknown global option" 2 mistake "--bogus" -- --bogus
check "bad option value" 2 mistake "--port" -- dashboard --port abc
check "missing cluster file" 2 mistake "no such cluster file" -- \
  plan tests/data/seeds/dsv41-flash-4x-mia --cluster "$work/nope.toml"
for bad in tests/data/bad_recipes/*.toml; do
  check "bad recipe $(basename "$bad" .toml)" 2 mistake "$bad" -- validate "$bad"
done
for seed in tests/data/seeds/*/recipe.toml; do
  check "plan $(basename "$(dirname "$seed")")" 0 ok "" -- plan "$seed" --cluster "$spark4"
  check "plan --json $(basename "$(dirname "$seed")")" 0 ok "" -- plan "$seed" --cluster "$spark4" --json
done
check "dashboard without [dashboard]" 2 mistake "sparkfleet[dashboard]" -- dashboard
check "gateway without [gateway]" 2 mistake "sparkfleet[gateway]" -- gateway serve
check "gateway key revoke of no key" 2 mistake "no active key" -- gateway key revoke nobody
check "gateway log (empty)" 0 ok "" -- gateway log --json
check "bench png without [plots]" 2 mistake "sparkfleet[plots]" -- bench export last --format png
check "needle png without [plots]" 2 mistake "sparkfleet[plots]" -- \
  eval needle http://127.0.0.1:9 --out "$work/heatmap.png"

echo "bare install: $((total - failures))/$total cases passed"
[ "$failures" -eq 0 ]
