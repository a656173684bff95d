#!/usr/bin/env bash
# A local cluster with real nodes: the control plane of e2e/controlplane (kwok
# nodes beside as before), its API served on an address of a bridge of its own,
# and NODEWARDEN_REAL_NODES (default 2) real kubelets on this one machine, each
# with its own containerd, CNI bridge and pod CIDR, and one kube-proxy. Run as
# root (bridges, iptables, containerd).
#
#   cluster.sh up       start (no-op when running); prints the kubeconfig path
#   cluster.sh down     stop everything `up` started, undo the network changes
#   cluster.sh status   each component and its pid
#   cluster.sh import ARCHIVE...   import OCI image archives into every node
#
# Nothing leaves the machine: the nodes, the API and the pods use addresses on
# the bridge nw0 (10.99.0.0/24) and the CNI bridges (10.244.0.0/16, Services
# 10.96.0.0/16); the guard chain NW-GUARD drops any packet from a pod to an
# address outside those; pods get a resolver configuration naming no server
# but the API's address (where nothing answers DNS).
#
# NODEWARDEN_RUN_DIR picks the run directory (default <repo>/.run/e2e).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export NODEWARDEN_RUN_DIR=${NODEWARDEN_RUN_DIR:-$repo/.run/e2e}
run_dir=$NODEWARDEN_RUN_DIR
nodes_dir=$run_dir/nodes
count=${NODEWARDEN_REAL_NODES:-2}

# The cluster's own addresses.
bridge=nw0
api_ip=10.99.0.1
node_net=10.99.0.0/24
pod_cidr=10.244.0.0/16
service_cidr=10.96.0.0/16
export NODEWARDEN_APISERVER_ADDRESS=$api_ip NODEWARDEN_POD_CIDR=$pod_cidr

log_tag=nodes
poll_interval=0.5
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

node_name() { echo "nw-node-$1"; }
node_ip() { echo "10.99.0.$((10 + $1))"; }

# --- the network --------------------------------------------------------------
# guard_rules: what a pod may reach (the cluster's own ranges); all else drops.
guard_rules() {
  iptables -t raw -N NW-GUARD 2>/dev/null || iptables -t raw -F NW-GUARD
  iptables -t raw -A NW-GUARD -d "$pod_cidr" -j RETURN
  iptables -t raw -A NW-GUARD -d "$service_cidr" -j RETURN
  iptables -t raw -A NW-GUARD -d "$node_net" -j RETURN
  iptables -t raw -A NW-GUARD -j DROP
  iptables -t raw -C PREROUTING -s "$pod_cidr" -j NW-GUARD 2>/dev/null ||
    iptables -t raw -I PREROUTING -s "$pod_cidr" -j NW-GUARD
}

network_up() {
  local i
  ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
  ip link set "$bridge" up
  for ip in "$api_ip" $(for i in $(seq 1 "$count"); do node_ip "$i"; done); do
    grep -q " $ip/32 " <<<"$(ip addr show dev "$bridge")" || ip addr add "$ip/32" dev "$bridge"
  done
  cat /proc/sys/net/ipv4/ip_forward >"$run_dir/ip_forward.before" 2>/dev/null || true
  sysctl -qw net.ipv4.ip_forward=1
  # br_netfilter: traffic between pods of one bridge passes iptables too (guard, Services).
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || log "warning: bridge-nf-call-iptables not settable"
  guard_rules
}

network_down() {
  local ns
  while iptables -t raw -D PREROUTING -s "$pod_cidr" -j NW-GUARD 2>/dev/null; do :; done
  iptables -t raw -F NW-GUARD 2>/dev/null || true
  iptables -t raw -X NW-GUARD 2>/dev/null || true
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
  ip -br link show type bridge 2>/dev/null | awk '$1 ~ /^nwcni[0-9]+$/ {print $1}' | while read -r b; do ip link delete "$b"; done
  ip link delete "$bridge" 2>/dev/null || true
  if [ -s "$run_dir/ip_forward.before" ]; then
    sysctl -qw net.ipv4.ip_forward="$(cat "$run_dir/ip_forward.before")"
    rm -f "$run_dir/ip_forward.before"
  fi
}

# --- one node -------------------------------------------------------------------
# client_cert FILE-PREFIX SUBJECT: an EC key and a client certificate signed by
# the control plane's CA (FILE-PREFIX.key, FILE-PREFIX.crt).
client_cert() {
  local out=$1 pki=$run_dir/pki
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$out.key" 2>/dev/null
  openssl req -new -key "$out.key" -subj "$2" -out "$out.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$out.ext"
  openssl x509 -req -in "$out.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -extfile "$out.ext" -out "$out.crt" 2>/dev/null
  rm -f "$out.csr" "$out.ext"
}

# client_kubeconfig FILE CERT-PREFIX: a kubeconfig for the API on the bridge.
client_kubeconfig() {
  cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: nodewarden-e2e
  cluster:
    server: https://$api_ip:$(cat "$run_dir/apiserver-port")
    certificate-authority-data: $(base64 -w0 "$run_dir/pki/ca.crt")
users:
- name: client
  user:
    client-certificate-data: $(base64 -w0 "$2.crt")
    client-key-data: $(base64 -w0 "$2.key")
contexts:
- name: nodewarden-e2e
  context: {cluster: nodewarden-e2e, user: client}
current-context: nodewarden-e2e
KUBECONFIG
}

# containerd_config I DIR: a containerd of the node's own (root, state, socket,
# runc state), its CNI config written from a template once the kubelet passes
# the node's pod CIDR.
containerd_config() {
  local i=$1 dir=$2
  mkdir -p "$dir/cni/net.d" "$dir/cni/ipam"
  cat >"$dir/cni/template.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "nw-node-$i",
  "plugins": [
    {
      "type": "bridge", "bridge": "nwcni$i", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
               "ranges": [[{"subnet": "{{.PodCIDR}}"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CNI
  cat >"$dir/containerd.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # This machine may lack CAP_SYS_RESOURCE: a negative oom_score_adj is refused.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # Each node's runc keeps its own state: two containerds share none.
        Root = "/run/containerd/runc-nw-node-$i"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
    conf_template = "$dir/cni/template.conflist"
TOML
}

kubelet_config() {
  local i=$1 dir=$2 ip
  ip=$(node_ip "$i")
  echo "nameserver $api_ip" >"$dir/resolv.conf"
  mkdir -p "$dir/pod-logs"
  cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /nw-node-$i
containerRuntimeEndpoint: unix://$dir/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $run_dir/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
# No DNS server runs here: pods name the API's address, where none answers,
# and never the machine's resolver.
clusterDNS: [$api_ip]
resolvConf: $dir/resolv.conf
podLogsDir: $dir/pod-logs
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
maxPods: 110
YAML
}

# start NAME DIR ARGS...: runs ARGS detached, logging to DIR/NAME.log.
start() {
  local name=$1 dir=$2
  shift 2
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$dir/$name.pid"
}

node_up() {
  local i=$1 dir name c
  name=$(node_name "$i")
  dir=$nodes_dir/$name
  mkdir -p "$dir"
  if [ ! -s "$dir/kubeconfig" ]; then
    client_cert "$dir/kubelet" "/O=system:nodes/CN=system:node:$name"
    client_kubeconfig "$dir/kubeconfig" "$dir/kubelet"
  fi
  containerd_config "$i" "$dir"
  kubelet_config "$i" "$dir"
  if ! pid_from_file "$dir/containerd.pid" containerd >/dev/null; then
    start containerd "$dir" containerd --config "$dir/containerd.toml"
    retry_until 30 "containerd of $name" ctr -a "$dir/containerd.sock" version
  fi
  # The kubelet wants its cgroupRoot in every hierarchy.
  for c in /sys/fs/cgroup/*/; do mkdir -p "${c}nw-node-$i"; done
  if ! pid_from_file "$dir/kubelet.pid" kubelet >/dev/null; then
    start kubelet "$dir" "$NODES_BIN/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubeconfig" \
      --root-dir="$dir/kubelet" --cert-dir="$dir/pki" --hostname-override="$name" \
      --node-ip="$(node_ip "$i")" --node-labels=nodewarden.dev/e2e-real=true --v=2
  fi
}

kube_proxy_up() {
  local dir=$nodes_dir/kube-proxy ip
  ip=$(node_ip 1)
  mkdir -p "$dir"
  if [ ! -s "$dir/kubeconfig" ]; then
    client_cert "$dir/kube-proxy" /CN=system:kube-proxy
    client_kubeconfig "$dir/kubeconfig" "$dir/kube-proxy"
  fi
  # One kube-proxy serves every node: they share this machine's network namespace.
  cat >"$dir/config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kubeconfig}
mode: iptables
hostnameOverride: $(node_name 1)
bindAddress: $ip
healthzBindAddress: $ip:10256
metricsBindAddress: $ip:10249
clusterCIDR: $pod_cidr
nodePortAddresses: ["$ip/32"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
  pid_from_file "$dir/kube-proxy.pid" kube-proxy >/dev/null ||
    start kube-proxy "$dir" "$NODES_BIN/kube-proxy" --config="$dir/config.yaml" --v=2
}

# wait_registered I: waits up to 120 s for node I's Node while its kubelet lives;
# else dies with the last lines of its kubelet's and containerd's logs.
wait_registered() {
  local name dir
  name=$(node_name "$1")
  dir=$nodes_dir/$name
  wait_started "the kubelet of $name" "$dir/kubelet.pid" "$dir/kubelet.log" kubectl_ get node "$name" && return 0
  log "last lines of $dir/containerd.log:"
  tail -n 30 "$dir/containerd.log" >&2 || true
  die "node $name did not register"
}

kubectl_() { "$(cat "$run_dir/bin-dir")/kubectl" --kubeconfig "$run_dir/kubeconfig" "$@"; }

up() {
  local i
  NODES_BIN=$("$here/build.sh" | tail -n 1)
  for tool in containerd ctr runc iptables; do
    command -v "$tool" >/dev/null || die "$tool is missing (Debian: containerd runc containernetworking-plugins iptables)"
  done
  [ -x /usr/lib/cni/bridge ] || die "the CNI plugins are missing in /usr/lib/cni (Debian: containernetworking-plugins)"
  mkdir -p "$nodes_dir"
  network_up
  "$repo/e2e/controlplane/cluster.sh" up >/dev/null
  for i in $(seq 1 "$count"); do node_up "$i"; done
  kube_proxy_up
  for i in $(seq 1 "$count"); do wait_registered "$i"; done
  kubectl_ wait --for=condition=Ready node -l nodewarden.dev/e2e-real=true --timeout=180s >/dev/null
  log "$count real nodes Ready; export KUBECONFIG=$run_dir/kubeconfig"
  echo "$run_dir/kubeconfig"
}

# stop_in DIR NAME: stops the process DIR/NAME.pid names, if it is still NAME.
stop_in() { stop_pid "$2" "$1/$2.pid" "$2" >/dev/null || true; }

# pods_down DIR: every container of the node's containerd stopped and removed.
pods_down() {
  local sock=$1/containerd.sock c
  [ -S "$sock" ] || return 0
  for c in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$sock" -n k8s.io tasks kill -s KILL "$c" 2>/dev/null || true; done
  sleep 1
  for c in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true; done
}

down() {
  local dir c root
  # Pods removed while the kubelets run: CNI DEL, unmounts and netns done by them.
  if [ -s "$run_dir/kubeconfig" ] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    kubectl_ delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1 || true
    sleep 3
  fi
  stop_in "$nodes_dir/kube-proxy" kube-proxy
  for dir in "$nodes_dir"/nw-node-*; do
    [ -d "$dir" ] || continue
    stop_in "$dir" kubelet
    pods_down "$dir"
    stop_in "$dir" containerd
  done
  "$repo/e2e/controlplane/cluster.sh" down >/dev/null 2>&1 || true
  [ -x "${NODES_BIN:-}/kube-proxy" ] || NODES_BIN=$("$here/build.sh" 2>/dev/null | tail -n 1) || true
  [ -x "${NODES_BIN:-}/kube-proxy" ] && "$NODES_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  # The kubelets' own chains, which kube-proxy's cleanup leaves.
  iptables -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
  iptables -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
  for t in filter nat mangle; do
    for c in KUBE-FIREWALL KUBE-KUBELET-CANARY; do
      iptables -t "$t" -F "$c" 2>/dev/null || true
      iptables -t "$t" -X "$c" 2>/dev/null || true
    done
  done
  network_down
  # Volume mounts left under the nodes' directories, deepest first.
  awk -v d="$nodes_dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  for c in /sys/fs/cgroup/*/; do
    for root in "${c}"nw-node-*; do
      [ -d "$root" ] && find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done
  rm -rf "$nodes_dir" /run/containerd/runc-nw-node-*
  log "real nodes and control plane stopped; network restored"
}

status() {
  local dir
  "$repo/e2e/controlplane/cluster.sh" status
  for dir in "$nodes_dir"/nw-node-* "$nodes_dir/kube-proxy"; do
    [ -d "$dir" ] || continue
    for c in containerd kubelet kube-proxy; do
      [ -f "$dir/$c.pid" ] || continue
      if pid=$(pid_from_file "$dir/$c.pid" "$c"); then echo "${dir##*/} $c running (pid $pid)"; else echo "${dir##*/} $c stopped"; fi
    done
  done
}

# import ARCHIVE...: each OCI archive into every node's containerd, checked by name.
import() {
  local dir archive
  for dir in "$nodes_dir"/nw-node-*; do
    for archive in "$@"; do
      ctr -a "$dir/containerd.sock" -n k8s.io images import "$archive" >/dev/null ||
        die "importing $archive into ${dir##*/} failed"
    done
  done
}

[ "$(id -u)" = 0 ] || die "real nodes need root (bridges, iptables, containerd)"
case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  import) shift; import "$@" ;;
  *) echo "usage: $0 up|down|status|import ARCHIVE..." >&2; exit 2 ;;
esac
