#!/usr/bin/env bash
# A real local Kubernetes control plane as plain processes on loopback:
# etcd, kube-apiserver (TLS, RBAC, service-account signing), kube-controller-manager,
# kube-scheduler and kwok (simulated kubelets).
#
#   cluster.sh up      start (no-op when already running and healthy); prints the kubeconfig path
#   cluster.sh down    stop exactly the processes `up` started, by pid
#   cluster.sh status  show each component and its pid
#   cluster.sh restart-apiserver   kill and restart kube-apiserver on the same port (tests)
#
# NODEWARDEN_API_ONLY=1 starts only etcd and kube-apiserver (tests that restart them).
# NODEWARDEN_APISERVER_ADDRESS serves the API on another local address than
# 127.0.0.1 (one that pods on real nodes reach, e2e/nodes/cluster.sh); then the
# `kubernetes` Service gets that endpoint, the API server reaches kubelets by
# InternalIP with a client certificate, and NODEWARDEN_POD_CIDR (if set) is
# split into the nodes' pod CIDRs by kube-controller-manager.
# NODEWARDEN_RUN_DIR picks the run directory (default: <repo>/.run/cluster); it holds
# certificates, kubeconfigs, pid files, the etcd data and every component's log.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
run_dir=${NODEWARDEN_RUN_DIR:-$repo/.run/cluster}
api_address=${NODEWARDEN_APISERVER_ADDRESS:-127.0.0.1}
pod_cidr=${NODEWARDEN_POD_CIDR:-}
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
wanted=("${components[@]}")
[ "${NODEWARDEN_API_ONLY:-0}" = 1 ] && wanted=(etcd kube-apiserver)

log_tag=cluster
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

bin_dir() {
  if [ -n "${NODEWARDEN_CONTROLPLANE_BIN:-}" ]; then
    echo "$NODEWARDEN_CONTROLPLANE_BIN"
  else
    "$here/build.sh" | tail -n 1
  fi
}

# port_free PORT: can a listener (with SO_REUSEADDR, as Go's) bind it now?
port_free() {
  python3 -c 'import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try: s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError: sys.exit(1)' "$1"
}

# pid_of NAME: the recorded pid, if that process is still the component we started.
pid_of() { pid_from_file "$run_dir/$1.pid" "$1"; }

stop_component() {
  if stop_pid "$1" "$run_dir/$1.pid" "$1"; then log "stopped $1 (pid $stopped_pid)"; fi
}

down() {
  local i
  for ((i = ${#components[@]} - 1; i >= 0; i--)); do
    stop_component "${components[$i]}"
  done
  rm -rf "$run_dir/etcd-data"
}

# start NAME ARGS...: runs the component detached, logging to $run_dir/NAME.log.
start() {
  local name=$1; shift
  # setsid: the component outlives the shell (and `just`) that started it.
  # 9>&-: the component must not inherit (and so hold forever) the run lock.
  setsid "$BIN/$name" "$@" >"$run_dir/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$run_dir/$name.pid"
}

# wait_healthy NAME CHECK-COMMAND...: polls until the check passes; a component that
# dies or never becomes healthy is reported with the tail of its log.
wait_healthy() {
  local name=$1
  shift
  wait_started "$name" "$run_dir/$name.pid" "$run_dir/$name.log" "$@" || return 1
  log "$name is healthy (pid $(cat "$run_dir/$name.pid"))"
}

healthy_all() {
  local c
  for c in "${wanted[@]}"; do pid_of "$c" >/dev/null || return 1; done
  [ -f "$run_dir/kubeconfig" ] || return 1
  api_ready
}

# api_address: the address the running API server serves on.
api_address() { cat "$run_dir/apiserver-address" 2>/dev/null || echo 127.0.0.1; }

api_ready() {
  curl -sf --max-time 2 --cacert "$run_dir/pki/ca.crt" --cert "$run_dir/pki/admin.crt" \
    --key "$run_dir/pki/admin.key" "https://$(api_address):$(cat "$run_dir/apiserver-port")/readyz" >/dev/null
}

# cert NAME CN [O] [SANS]: an EC P-256 key and a certificate signed by the run's CA.
cert() {
  local name=$1 cn=$2 org=${3:-} sans=${4:-} subj ext
  subj="/CN=$cn"
  [ -n "$org" ] && subj="/O=$org$subj"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/$name.key" 2>/dev/null
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  ext="$pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

# kubeconfig FILE CERT-NAME: a kubeconfig for the apiserver with a client certificate.
kubeconfig() {
  local file=$1 name=$2
  cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: nodewarden-local
  cluster:
    server: https://$(api_address):$(cat "$run_dir/apiserver-port")
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$pki/$name.crt")
    client-key-data: $(base64 -w0 "$pki/$name.key")
contexts:
- name: nodewarden-local
  context:
    cluster: nodewarden-local
    user: $name
current-context: nodewarden-local
KUBECONFIG
}

make_pki() {
  pki="$run_dir/pki"
  rm -rf "$pki"
  mkdir -p "$pki"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=nodewarden-local-ca" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt" 2>/dev/null
  cert apiserver kube-apiserver "" \
    "IP:127.0.0.1,IP:$api_address,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin nodewarden-admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kwok system:kwok system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# write_audit_policy: the API server records every write nodewarden's
# ServiceAccount makes (and the Lease bodies, to tell holder from holder), so a
# test can check that no replica acted outside its lease term. Nothing else is
# recorded: the log stays small on a shared cluster.
write_audit_policy() {
  cat >"$run_dir/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  users: ["system:serviceaccount:nodewarden-system:nodewarden"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
  users: ["system:serviceaccount:nodewarden-system:nodewarden"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
POLICY
}

start_apiserver() {
  write_audit_policy
  # On loopback no pod can use the `kubernetes` Service: it keeps no endpoint.
  local real_node_args=(--endpoint-reconciler-type=none)
  if [ "$(api_address)" != 127.0.0.1 ]; then
    # Kubelets by InternalIP: a node name never goes to the machine's resolver.
    real_node_args=(--kubelet-preferred-address-types=InternalIP
      --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt"
      --kubelet-client-key="$pki/apiserver-kubelet-client.key")
  fi
  start kube-apiserver \
    --audit-policy-file="$run_dir/audit-policy.yaml" --audit-log-path="$run_dir/audit.log" \
    --audit-log-format=json --audit-log-maxsize=200 --audit-log-maxbackup=1 \
    --bind-address="$(api_address)" --advertise-address="$(api_address)" \
    --secure-port="$(cat "$run_dir/apiserver-port")" \
    --etcd-servers="http://127.0.0.1:$(cat "$run_dir/etcd-port")" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    "${real_node_args[@]}" \
    --allow-privileged=true \
    --watch-cache-sizes=configmaps#0 \
    --profiling=true
  # ConfigMaps skip the watch cache so that compacting etcd makes their old
  # resourceVersions expire at once: that is how tests force a 410 Gone.
  # Profiling answers at /debug/pprof/ (cluster-admin only): benches read
  # where the API server's CPU went.
  wait_healthy kube-apiserver api_ready
}

# start_kwok STAGES-FILE: kwok plays kubelet for Nodes annotated
# kwok.x-k8s.io/node=fake, and only those, through the stages (build.sh writes
# them). It reads them only at start, so it runs with a copy in the run
# directory: `up` compares that copy to tell whether kwok must restart.
start_kwok() {
  cp "$1" "$run_dir/kwok-stages.yaml"
  start kwok \
    --kubeconfig="$run_dir/kwok.kubeconfig" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --config="$run_dir/kwok-stages.yaml" \
    --cidr=10.128.0.0/16 --node-ip=127.0.0.1 --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$(cat "$run_dir/kwok-port")"
  wait_healthy kwok curl -sf --max-time 2 "http://127.0.0.1:$(cat "$run_dir/kwok-port")/healthz"
}

# restart_kwok_if_stages_changed: a running control plane keeps everything but
# kwok, which restarts (same binary) when the stages changed since it started.
restart_kwok_if_stages_changed() {
  local stages
  stages="$(bin_dir)/kwok-stages.yaml"
  cmp -s "$stages" "$run_dir/kwok-stages.yaml" && return 0
  log "kwok stages changed: restarting kwok"
  BIN=$(cat "$run_dir/bin-dir")
  stop_component kwok
  start_kwok "$stages" || { down; exit 1; }
}

up() {
  mkdir -p "$run_dir"
  if healthy_all; then
    [ "${NODEWARDEN_API_ONLY:-0}" = 1 ] || restart_kwok_if_stages_changed
    # A control plane started before the audit log existed gets it now.
    [ -f "$run_dir/audit-policy.yaml" ] || restart_apiserver
    log "already running; kubeconfig: $run_dir/kubeconfig"
    echo "$run_dir/kubeconfig"
    return 0
  fi
  # Half-started or crashed leftovers: stop what is ours and start clean.
  down
  BIN=$(bin_dir)
  echo "$BIN" >"$run_dir/bin-dir"
  echo "$api_address" >"$run_dir/apiserver-address"
  make_pki
  local ports etcd_port etcd_peer_port apiserver_port cm_port scheduler_port kwok_port
  ports=$(free_ports 6)
  read -r etcd_port etcd_peer_port apiserver_port cm_port scheduler_port kwok_port <<<"$ports"
  echo "$etcd_port" >"$run_dir/etcd-port"
  echo "$apiserver_port" >"$run_dir/apiserver-port"
  echo "$cm_port" >"$run_dir/controller-manager-port"
  echo "$scheduler_port" >"$run_dir/scheduler-port"
  echo "$kwok_port" >"$run_dir/kwok-port"

  start etcd --name=nodewarden-local --data-dir="$run_dir/etcd-data" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="nodewarden-local=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --quota-backend-bytes=4294967296 --log-level=warn
  wait_healthy etcd curl -sf --max-time 2 "http://127.0.0.1:$etcd_port/health" || { down; exit 1; }

  start_apiserver || { down; exit 1; }
  kubeconfig "$run_dir/kubeconfig" admin
  kubeconfig "$run_dir/controller-manager.kubeconfig" controller-manager
  kubeconfig "$run_dir/scheduler.kubeconfig" scheduler
  kubeconfig "$run_dir/kwok.kubeconfig" kwok

  if [ "${NODEWARDEN_API_ONLY:-0}" = 1 ]; then
    log "etcd and kube-apiserver are up (API only); logs in $run_dir"
    echo "$run_dir/kubeconfig"
    return 0
  fi

  local ipam_args=(--controllers='*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle,-route')
  if [ -n "$pod_cidr" ]; then
    ipam_args=(--controllers='*,-service-lb-controller,-cloud-node-lifecycle,-route'
      --allocate-node-cidrs=true --cluster-cidr="$pod_cidr" --node-cidr-mask-size=24
      --service-cluster-ip-range=10.96.0.0/16)
  fi
  start kube-controller-manager \
    --kubeconfig="$run_dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$run_dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$run_dir/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$(cat "$run_dir/controller-manager-port")" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    "${ipam_args[@]}" \
    --profiling=false
  wait_healthy kube-controller-manager curl -skf --max-time 2 \
    "https://127.0.0.1:$(cat "$run_dir/controller-manager-port")/healthz" || { down; exit 1; }

  start kube-scheduler \
    --kubeconfig="$run_dir/scheduler.kubeconfig" \
    --authentication-kubeconfig="$run_dir/scheduler.kubeconfig" \
    --authorization-kubeconfig="$run_dir/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$(cat "$run_dir/scheduler-port")" \
    --leader-elect=false --profiling=false
  wait_healthy kube-scheduler curl -skf --max-time 2 \
    "https://127.0.0.1:$(cat "$run_dir/scheduler-port")/healthz" || { down; exit 1; }

  start_kwok "$BIN/kwok-stages.yaml" || { down; exit 1; }

  log "control plane is up; logs in $run_dir"
  log "  export KUBECONFIG=$run_dir/kubeconfig"
  echo "$run_dir/kubeconfig"
}

status() {
  local c pid
  for c in "${components[@]}"; do
    if pid=$(pid_of "$c"); then echo "$c running (pid $pid)"; else echo "$c stopped"; fi
  done
}

restart_apiserver() {
  pki="$run_dir/pki"
  BIN=$(cat "$run_dir/bin-dir")
  local pid
  pid=$(pid_of kube-apiserver) || die "kube-apiserver is not running"
  kill -KILL "$pid"
  while alive "$pid"; do sleep 0.05; done
  log "killed kube-apiserver (pid $pid)"
  mv "$run_dir/kube-apiserver.log" "$run_dir/kube-apiserver.log.1" 2>/dev/null || true
  # The killed server's connections linger (FIN_WAIT) until their peers close
  # them; the port can be bound again only then.
  local port i
  port=$(cat "$run_dir/apiserver-port")
  for i in $(seq 1 300); do
    port_free "$port" && break
    sleep 0.2
  done
  start_apiserver
}

# One cluster.sh at a time per run directory (test binaries may race to start it).
mkdir -p "$run_dir"
exec 9>"$run_dir/.lock"
flock 9

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  restart-apiserver) restart_apiserver ;;
  *) echo "usage: $0 up|down|status|restart-apiserver" >&2; exit 2 ;;
esac
