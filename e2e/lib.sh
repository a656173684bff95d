# Helpers shared by the e2e scripts (sourced, not run): messages (say, log, die),
# polling (retry_until, wait_started), ports and processes (free_ports, alive,
# pid_from_file, stop_pid), the leader's Lease (lease_holder) and the pinned Go
# tools' builds (go_pinned, require_go, module_dir, go_build_binaries,
# go_build_tool). Sourced by
# e2e/controlplane/cluster.sh, e2e/jaeger/run.sh, e2e/moto/moto.sh,
# e2e/demo/demo.sh and, through e2e/kind/lib.sh, the kind scripts.
# shellcheck shell=bash

# --- messages -------------------------------------------------------------------
# The sourcing script sets log_tag to its name (cluster, jaeger, demo, ...) and, to
# stamp each line with the seconds since a start instead (e2e/kind), log_since to
# that start (epoch seconds).
#   say MESSAGE...  progress on stdout: "==> MESSAGE" (bold on a terminal);
#                   with log_since "[TAG   Ns] MESSAGE"
#   log MESSAGE...  a line on stderr: "TAG: MESSAGE"; with log_since "[TAG   Ns] MESSAGE"
#   die MESSAGE...  log MESSAGE (with log_since: "FAILED: MESSAGE") and exit 1

# log_stamp: what starts a log line ("TAG:" or "[TAG   Ns]").
log_stamp() {
  if [ -n "${log_since:-}" ]; then
    printf '[%s %4ds]' "${log_tag:-${0##*/}}" "$(($(date +%s) - log_since))"
  else
    printf '%s:' "${log_tag:-${0##*/}}"
  fi
}

say() {
  if [ -n "${log_since:-}" ]; then
    printf '%s %s\n' "$(log_stamp)" "$*"
  elif [ -t 1 ]; then
    printf '\033[1m==>\033[0m %s\n' "$*"
  else
    printf '==> %s\n' "$*"
  fi
}

log() { printf '%s %s\n' "$(log_stamp)" "$*" >&2; }

die() {
  log "${log_since:+FAILED: }$*"
  exit 1
}

# --- polling --------------------------------------------------------------------

# retry_until SECONDS DESCRIPTION CMD...: runs CMD (quietly) every poll_interval
# seconds (default 2; the sourcing script may set it) until it succeeds; after
# SECONDS runs it once more with its output shown and dies: "timed out after
# SECONDSs waiting for DESCRIPTION".
retry_until() {
  local timeout=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      "$@" >&2 || true
      die "timed out after ${timeout}s waiting for $what"
    fi
    sleep "${poll_interval:-2}"
  done
}

# wait_started NAME PID_FILE LOG_FILE CHECK...: polls CHECK (quietly) every 0.2 s for
# up to 120 s while the process PID_FILE records lives. When the process dies or
# CHECK never passes: logs so with the last lines of LOG_FILE and returns 1.
wait_started() {
  local name=$1 pid_file=$2 log_file=$3 why="did not become ready within 120 s" _
  shift 3
  for _ in $(seq 1 600); do
    # Not pid_from_file: right after fork the process is still setsid, not NAME.
    if ! alive "$(cat "$pid_file")"; then
      why="died during start-up"
      break
    fi
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "$name $why; last lines of $log_file:"
  tail -n 30 "$log_file" >&2 || true
  return 1
}

# --- ports and processes --------------------------------------------------------

# free_ports N: N distinct free loopback ports below the kernel's ephemeral range, so
# that no outgoing connection can take one while a process (re)starts on it.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
ports = []
for _ in range(5000):
    if len(ports) == n:
        break
    port = random.randrange(10000, max(low, 10001))
    if port in ports:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    ports.append(port)
if len(ports) != n:
    raise SystemExit("no free port")
print(" ".join(map(str, ports)))
PY
}

# alive PID: the process exists and is not a zombie waiting to be reaped (a zombie has
# exited already, but keeps its /proc entry).
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# pid_from_file FILE EXE_NAME: the pid FILE records, only if that live process still runs
# the binary EXE_NAME: a recycled pid belongs to some other program, never signal that.
pid_from_file() {
  local pid
  [ -f "$1" ] || return 1
  pid=$(cat "$1")
  [ -n "$pid" ] && alive "$pid" || return 1
  [ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null || true)")" = "$2" ] || return 1
  echo "$pid"
}

# stop_pid NAME FILE EXE_NAME: stops exactly the process pid_from_file finds (SIGTERM,
# SIGKILL after 10 s) and removes FILE; returns 1 when none was running, else sets
# stopped_pid (a global, so that no subshell stands between this shell and its child).
stop_pid() {
  local name=$1 file=$2 pid
  pid=$(pid_from_file "$file" "$3") || { rm -f "$file"; return 1; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "$name (pid $pid) ignored SIGTERM for 10 s; killing"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
  fi
  alive "$pid" && die "$name (pid $pid) is still running"
  # Gone only once reaped (so nothing shows in pgrep afterwards): our own child
  # right here, any other process by init.
  wait "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  rm -f "$file"
  # shellcheck disable=SC2034 # read by the sourcing script
  stopped_pid=$pid
}

# --- the leader -----------------------------------------------------------------

# lease_holder NAMESPACE NAME [KUBECTL...]: the holderIdentity of the Lease NAMESPACE/NAME,
# empty when it has none, does not exist or the API does not answer. KUBECTL is the
# command to ask with (default kubectl; e.g. a function adding --kubeconfig).
lease_holder() {
  local ns=$1 name=$2
  shift 2
  [ "$#" -gt 0 ] || set -- kubectl
  "$@" -n "$ns" get lease "$name" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true
}

# --- pinned Go tools --------------------------------------------------------------

# go_tool_dir NAME VERSION SCRIPT: the cache directory for a pinned Go tool built
# by SCRIPT from the go.mod of the current directory, keyed by that go.mod, go.sum
# and SCRIPT: $cache/NAME/VERSION-KEY. Created when missing.
go_tool_dir() {
  local key dir
  key=$(cat go.mod go.sum "$3" | sha256sum | cut -c1-16)
  dir="${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}/$1/$2-$key"
  mkdir -p "$dir"
  echo "$dir"
}

# go_pinned CMD...: runs CMD (go ...) as every pinned Go build here runs: the
# local toolchain only (never a download), modules verified against go.sum,
# no cgo, and a compiler that collects garbage four times less often. GOGC=400
# measured on a cold build of client-go and the apiserver library: 180 s
# instead of 247 s; memory is plentiful next to time here.
go_pinned() {
  GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 GOGC="${GOGC:-400}" "$@"
}

# require_go MINOR: dies unless the local Go is at least 1.MINOR (the pinned
# modules' go lines; a toolchain is never downloaded).
require_go() {
  local version minor
  version=$(go_pinned go env GOVERSION)
  minor=$(sed -E 's/^go1\.([0-9]+).*/\1/' <<<"$version")
  [ "${minor:-0}" -ge "$1" ] || die "Go >= 1.$1 is required (found $version)"
}

# module_dir MODULE@VERSION: the module's directory in the module cache
# (downloaded when missing), for the files a build takes from it.
module_dir() {
  local dir
  dir=$(go_pinned go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || die "cannot locate module $1"
  echo "$dir"
}

# go_build_binaries BIN_DIR LDFLAGS PKG...: builds every PKG (from the go.mod of
# the current directory) with one `go build`, so the packages they share are
# compiled once and the links run side by side; each binary is named after its
# package's last path element. They are built in a temporary directory and moved
# into BIN_DIR, so an interrupted build never leaves a binary a later run would
# take as done. Dies with the compiler's output when the build fails.
go_build_binaries() {
  local bin_dir=$1 ldflags=$2 pkg
  shift 2
  local names=("${@##*/}")
  go_build_moved "$bin_dir" "$ldflags" "$bin_dir/.build.$$/" "${names[*]}" "$@"
  for pkg in "${names[@]}"; do mv "$bin_dir/.build.$$/$pkg" "$bin_dir/$pkg"; done
  rmdir "$bin_dir/.build.$$"
}

# go_build_tool BIN_DIR NAME PKG [LDFLAGS]: go_build_binaries for one package,
# whose binary is named NAME.
go_build_tool() {
  local bin_dir=$1 name=$2 pkg=$3 ldflags=${4:--s -w}
  go_build_moved "$bin_dir" "$ldflags" "$bin_dir/.build.$$/$name" "$name" "$pkg"
  mv "$bin_dir/.build.$$/$name" "$bin_dir/$name"
  rmdir "$bin_dir/.build.$$"
}

# go_build_moved BIN_DIR LDFLAGS OUT LABEL PKG...: the `go build -o OUT` of the
# two above, timed and logged; OUT is under BIN_DIR/.build.PID, removed on failure.
go_build_moved() {
  local bin_dir=$1 ldflags=$2 out=$3 label=$4 start output
  shift 4
  log "building $label from $* ..."
  start=$(date +%s)
  rm -rf "$bin_dir/.build.$$" && mkdir -p "$bin_dir/.build.$$"
  if ! output=$(go_pinned go build -trimpath -ldflags "$ldflags" -o "$out" "$@" 2>&1); then
    rm -rf "$bin_dir/.build.$$"
    log "$output"
    die "building $* failed"
  fi
  log "$label built in $(($(date +%s) - start)) s"
}
