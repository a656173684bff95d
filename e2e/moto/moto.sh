#!/usr/bin/env bash
# moto, the AWS mock (PyPI moto[server]), pinned: requirements.txt beside this
# script (every package pinned and hashed) installed once into a virtualenv in
# the cache directory outside the repository, keyed by that file and the python3
# that runs it, and reused from there; its server runs as a plain process on
# loopback.
#
#   moto.sh install          install the virtualenv (no-op when present); prints its path
#   moto.sh start <run-dir>  start moto_server (no-op when already running there) on a free
#                            loopback port; waits until it answers; prints its endpoint URL
#   moto.sh stop <run-dir>   stop exactly the process `start` recorded, by pid
#
# <run-dir> receives: moto.log, pid, port and, while it runs, endpoint (the URL printed:
# http://127.0.0.1:<port>; any region, any credentials).
# The virtualenv's python has boto3 too: "$(moto.sh install)/bin/python" client.py.
# NODEWARDEN_MOTO_VENV picks an installed virtualenv for `start` (default: `install`'s).
# Needs python3 with its venv module (pip comes with it), and PyPI for the first install.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
requirements="$here/requirements.txt"

log_tag=moto
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}

usage() { die "usage: $0 install | start <run-dir> | stop <run-dir>"; }

# --- install --------------------------------------------------------------------

# venv_path: where requirements.txt is installed for this python3. The key also
# covers the interpreter's build and place: a virtualenv runs on the python that
# made it.
venv_path() {
  local key
  key=$({
    cat "$requirements"
    python3 -c 'import sys; print(sys.version); print(sys.base_prefix)'
  } | sha256sum | cut -c1-16)
  echo "$cache_root/moto-$key"
}

# install: prints the virtualenv's path, installing it first when missing.
install() {
  local venv version out
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to install moto"
  venv=$(venv_path)
  if [ -x "$venv/bin/moto_server" ]; then
    echo "$venv"
    return 0
  fi
  mkdir -p "$cache_root"
  # One install at a time (test binaries may race to start moto); whoever waited
  # finds the first one's install done.
  exec 8>"$cache_root/.moto.lock"
  flock 8
  if [ ! -x "$venv/bin/moto_server" ]; then
    version=$(sed -n 's/^moto==\([^ ]*\).*/\1/p' "$requirements")
    [ -n "$version" ] || die "$requirements pins no moto version"
    # Installed beside its place and renamed into it once it works, so that an
    # interrupted install is never taken as done.
    tmp=$(mktemp -d "$cache_root/.${venv##*/}.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    log "installing moto[server]==$version into $venv"
    # --no-deps with --require-hashes: exactly the pinned, hashed set, nothing
    # resolved anew; --only-binary: wheels only, no builds (and no unhashed build
    # dependencies).
    if ! out=$({ python3 -m venv "$tmp" &&
      "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --require-hashes --no-deps --only-binary=:all: -r "$requirements" &&
      "$tmp/bin/python" -m pip check --disable-pip-version-check &&
      "$tmp/bin/python" -c 'import sys, moto, moto.server, moto.ec2, moto.autoscaling, boto3
assert moto.__version__ == sys.argv[1], moto.__version__' "$version"; } 2>&1); then
      log "installing moto[server]==$version failed (python3 needs its venv module, pip needs PyPI):"
      echo "$out" >&2
      exit 1
    fi
    # The scripts in bin/ (moto_server, pip, activate) name the directory they were
    # installed in: point them at the final one before moving there.
    "$tmp/bin/python" - "$tmp" "$venv" <<'PY'
import os, sys
old, new = (os.fsencode(p) for p in sys.argv[1:3])
bin_dir = os.path.join(sys.argv[1], "bin")
for name in os.listdir(bin_dir):
    path = os.path.join(bin_dir, name)
    if os.path.islink(path) or not os.path.isfile(path):
        continue
    with open(path, "rb") as f:
        data = f.read()
    if old in data:
        with open(path, "wb") as f:
            f.write(data.replace(old, new))
PY
    # rename(2) fails onto a directory that exists (one left without a working
    # moto_server, see below): then tmp goes.
    python3 -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$tmp" "$venv" 2>/dev/null || rm -rf "$tmp"
    trap - EXIT
    [ -x "$venv/bin/moto_server" ] || die "$venv holds no working bin/moto_server: remove it and run this again"
    log "installed moto[server]==$version"
  fi
  exec 8>&-
  echo "$venv"
}

# --- start / stop ---------------------------------------------------------------

# pid_of: the recorded pid, if that process is still a moto_server (python running
# .../bin/moto_server): a recycled pid belongs to some other program, never signal that.
pid_of() {
  local pid
  [ -f "$run_dir/pid" ] || return 1
  pid=$(cat "$run_dir/pid")
  [ -n "$pid" ] && alive "$pid" || return 1
  [[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n 2p)" == */moto_server ]] || return 1
  echo "$pid"
}

stop() {
  local pid exe
  rm -f "$run_dir/endpoint"
  if pid=$(pid_of) && exe=$(readlink "/proc/$pid/exe") &&
    stop_pid moto "$run_dir/pid" "${exe##*/}"; then
    log "stopped moto (pid $stopped_pid)"
  else
    rm -f "$run_dir/pid"
    log "not running in $run_dir"
  fi
}

# ready: the server answers its own API (the dashboard page).
ready() { curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$port/moto-api/"; }

start() {
  local pid venv
  if pid=$(pid_of); then
    if port=$(cat "$run_dir/port") && ready; then
      log "already running (pid $pid) in $run_dir"
      echo "http://127.0.0.1:$port"
      return 0
    fi
    stop
  fi
  venv=${NODEWARDEN_MOTO_VENV:-$(install)}
  [ -x "$venv/bin/moto_server" ] || die "no bin/moto_server in $venv"
  rm -f "$run_dir/endpoint"
  port=$(free_ports 1)
  echo "$port" >"$run_dir/port"
  # setsid: moto outlives the shell that started it. 8>&- 9>&-: it must not
  # inherit (and so hold forever) the install or run lock.
  setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$run_dir/moto.log" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$run_dir/pid"
  if ! wait_started moto "$run_dir/pid" "$run_dir/moto.log" ready; then
    # Never ready: stopped; dead: only its pid file goes.
    stop
    return 1
  fi
  echo "http://127.0.0.1:$port" >"$run_dir/endpoint"
  log "ready (pid $(cat "$run_dir/pid")): http://127.0.0.1:$port"
  echo "http://127.0.0.1:$port"
}

case "${1:-}" in
  install)
    [ $# -eq 1 ] || usage
    install
    ;;
  start | stop)
    [ $# -eq 2 ] || usage
    mkdir -p "$2"
    run_dir=$(cd "$2" && pwd)
    # One start or stop at a time per run directory.
    exec 9>"$run_dir/.lock"
    flock 9
    "$1"
    ;;
  *) usage ;;
esac
