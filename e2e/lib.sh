# Process and port helpers shared by e2e/controlplane/cluster.sh, e2e/jaeger/run.sh
# and e2e/demo/demo.sh (sourced, not run). The sourcing script defines log and die.
# shellcheck shell=bash

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
