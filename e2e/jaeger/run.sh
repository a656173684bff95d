#!/usr/bin/env bash
# A local Jaeger v2 all-in-one (in-memory storage) as a plain process on loopback.
#
#   run.sh start <run-dir>   start jaeger (no-op when already running there); waits until
#                            the query API and the OTLP/HTTP receiver answer
#   run.sh stop <run-dir>    stop exactly the process `start` recorded, by pid
#
# <run-dir> receives: config.yaml, jaeger.log, jaeger.pid and the chosen ports
#   otlp-http-port   OTLP/HTTP receiver: POST http://127.0.0.1:<port>/v1/traces
#   query-port       query HTTP API (and placeholder UI): http://127.0.0.1:<port>/api/traces
#   query-grpc-port  query gRPC API (unused by the tests, but must not collide)
# NODEWARDEN_JAEGER_BIN picks the directory holding `jaeger` (default: build.sh output).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log_tag=jaeger
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

usage() { die "usage: $0 start|stop <run-dir>"; }
[ $# -eq 2 ] || usage
cmd=$1
mkdir -p "$2"
run_dir=$(cd "$2" && pwd)

bin_dir() {
  if [ -n "${NODEWARDEN_JAEGER_BIN:-}" ]; then
    echo "$NODEWARDEN_JAEGER_BIN"
  else
    "$here/build.sh" | tail -n 1
  fi
}

# pid_of: the recorded pid, if that process is still the jaeger we started.
pid_of() { pid_from_file "$run_dir/jaeger.pid" jaeger; }

stop() {
  if stop_pid jaeger "$run_dir/jaeger.pid" jaeger; then
    log "stopped jaeger (pid $stopped_pid)"
  else
    log "not running in $run_dir"
  fi
}

# ready: the query API answers and the OTLP/HTTP receiver accepts an (empty) export.
ready() {
  curl -sf --max-time 2 "http://127.0.0.1:$query_port/api/services" >/dev/null &&
    curl -sf --max-time 2 -X POST -H 'Content-Type: application/json' -d '{}' \
      "http://127.0.0.1:$otlp_port/v1/traces" >/dev/null
}

# write_config: the pinned module's cmd/jaeger/internal/all-in-one.yaml, reduced to
# what the tests use (OTLP/HTTP in, memory storage, query API) on the chosen ports,
# with the collector's own metrics endpoint (fixed port 8888) switched off, and
# jaeger_query's self-tracing off (it defaults to on and exports jaeger's own spans
# over OTLP/gRPC to localhost:4317; with nothing there, shutdown stalls ~10 s).
write_config() {
  cat >"$run_dir/config.yaml" <<EOF
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:$query_port
    grpc:
      endpoint: 127.0.0.1:$query_grpc_port

  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$otlp_port

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
}

start() {
  local pid bin
  if pid=$(pid_of); then
    query_port=$(cat "$run_dir/query-port")
    otlp_port=$(cat "$run_dir/otlp-http-port")
    if ready; then
      log "already running (pid $pid) in $run_dir"
      return 0
    fi
    stop
  fi
  bin=$(bin_dir)
  [ -x "$bin/jaeger" ] || die "no jaeger binary in $bin"
  read -r otlp_port query_port query_grpc_port <<<"$(free_ports 3)"
  write_config
  echo "$otlp_port" >"$run_dir/otlp-http-port"
  echo "$query_port" >"$run_dir/query-port"
  echo "$query_grpc_port" >"$run_dir/query-grpc-port"
  # setsid: jaeger outlives the shell that started it.
  setsid "$bin/jaeger" --config "file:$run_dir/config.yaml" >"$run_dir/jaeger.log" 2>&1 </dev/null &
  echo $! >"$run_dir/jaeger.pid"
  if ! wait_started jaeger "$run_dir/jaeger.pid" "$run_dir/jaeger.log" ready; then
    # Never ready: stopped; dead: only its pid file goes.
    if stop_pid jaeger "$run_dir/jaeger.pid" jaeger; then log "stopped jaeger (pid $stopped_pid)"; fi
    return 1
  fi
  log "ready (pid $(cat "$run_dir/jaeger.pid")): OTLP/HTTP 127.0.0.1:$otlp_port, query 127.0.0.1:$query_port"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
