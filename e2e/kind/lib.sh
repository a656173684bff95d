# Helpers shared by e2e/kind/run.sh and e2e/kind/suite.sh (sourced, not run), on
# top of e2e/lib.sh (say, die, retry_until, lease_holder, ...), which this sources.
# shellcheck shell=bash

# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

E2E_CLUSTER=${E2E_CLUSTER:-nodewarden-e2e}
E2E_NS=nodewarden-system
E2E_START=${E2E_START:-$(date +%s)}
export E2E_START

# say and die (e2e/lib.sh) start their lines with "[e2e   Ns]", the seconds since
# the run started (run.sh's start, for suite.sh too); die's go on with "FAILED:".
log_tag=e2e
log_since=$E2E_START

# need CMD HINT: fail with a clear message when CMD is not installed.
need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed or not on PATH: $2"
}

# timing NAME SECONDS: records a phase for the summary (a file shared by
# run.sh and suite.sh when E2E_TIMINGS is set).
timing() {
  [ -n "${E2E_TIMINGS:-}" ] && printf '%s\t%s\n' "$1" "$2" >>"$E2E_TIMINGS"
  return 0
}

# result WHAT: a check that passed, said now and listed again by print_summary.
E2E_RESULTS=()
result() {
  E2E_RESULTS+=("$1")
  say "ok: $1"
}

# print_summary TITLE: the PASSED banner, every result, the timings and the total.
print_summary() {
  local banner="==================== $1: PASSED ====================" r phase secs
  echo
  echo "$banner"
  for r in "${E2E_RESULTS[@]}"; do echo "  ok  $r"; done
  if [ -s "${E2E_TIMINGS:-}" ]; then
    echo "  timings:"
    while IFS=$'\t' read -r phase secs; do printf '    %5ss  %s\n' "$secs" "$phase"; done <"$E2E_TIMINGS"
  fi
  echo "  total: $(($(date +%s) - E2E_START))s"
  echo "${banner//?/=}"
}

# phase NAME CMD...: runs CMD and records how long it took.
phase() {
  local name=$1 t
  shift
  t=$(date +%s)
  "$@"
  timing "$name" $(($(date +%s) - t))
}

# Background `kubectl port-forward` processes of this shell, stopped by
# stop_port_forwards (each by its own pid).
E2E_PORT_FORWARD_PIDS=()

# port_forward NAMESPACE TARGET REMOTE_PORT: starts `kubectl port-forward` on a
# free local port and sets E2E_PF_PORT to it (a variable, not output: the pid
# must be recorded in this shell, not in a command substitution's subshell).
port_forward() {
  local ns=$1 target=$2 remote=$3 log pid port="" _
  log=$(mktemp)
  kubectl -n "$ns" port-forward "$target" ":$remote" >"$log" 2>&1 &
  pid=$!
  E2E_PORT_FORWARD_PIDS+=("$pid")
  for _ in $(seq 1 60); do
    port=$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9][0-9]*\) .*/\1/p;T;q' "$log")
    [ -n "$port" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2
      rm -f "$log"
      die "kubectl port-forward -n $ns $target exited"
    fi
    sleep 0.5
  done
  rm -f "$log"
  [ -n "$port" ] || die "kubectl port-forward -n $ns $target did not start within 30 s"
  # shellcheck disable=SC2034  # read by the sourcing script
  E2E_PF_PORT=$port
}

stop_port_forwards() {
  local pid
  for pid in "${E2E_PORT_FORWARD_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  E2E_PORT_FORWARD_PIDS=()
}

# dump_diagnostics FILE: what a failed run needs to be understood, once per
# run (both run.sh and suite.sh call it on failure).
dump_diagnostics() {
  local out=$1 pod
  [ -e "$out" ] && return 0
  {
    echo "=== nodes"
    kubectl get nodes -o wide --show-labels
    echo "=== pods"
    kubectl get pods -A -o wide
    echo "=== nodeversions, scalinggroups, pendingnodes, nodemaintenances"
    kubectl get nodeversions.update.edgeless.systems,scalinggroups.update.edgeless.systems,pendingnodes.update.edgeless.systems,nodemaintenances.nodemaintenance.medik8s.io -o wide
    kubectl get nodeversions.update.edgeless.systems -o yaml
    echo "=== lease"
    kubectl -n "$E2E_NS" get lease nodewarden -o yaml
    echo "=== events (last 80)"
    kubectl get events -A --sort-by=.lastTimestamp | tail -n 80
    for pod in $(kubectl -n "$E2E_NS" get pods -l app.kubernetes.io/name=nodewarden -o name); do
      echo "=== logs $pod (last 200 lines)"
      kubectl -n "$E2E_NS" logs "$pod" --tail=200
    done
    echo "=== logs sim-cloud (last 200 lines)"
    kubectl -n "$E2E_NS" logs deploy/sim-cloud --tail=200
    echo "=== logs kwok-controller (last 50 lines)"
    kubectl -n kube-system logs deploy/kwok-controller --tail=50
  } >"$out" 2>&1 || true
  echo "diagnostics written to $out" >&2
}
