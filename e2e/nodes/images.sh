#!/usr/bin/env bash
# The images the real nodes run besides nodewarden's own (`just image`), as OCI
# archives written without Docker or a registry (e2e/image/oci.py), into the
# cache outside the repository; prints their paths, one per line:
#   registry.k8s.io/pause:3.10          the pod sandbox (pause.c of the pinned Kubernetes)
#   nodewarden.dev/e2e/busybox:1        Debian's static busybox, for workloads
#   nodewarden.dev/e2e/upgrade:v1       a Plan's upgrade image: busybox and /upgrade
#   docker.io/jaegertracing/jaeger:2.13.0  the pinned Jaeger (e2e/jaeger), as observability/jaeger.yaml names it
# With --no-pause (kind, whose nodes bring their own sandbox image), all but the first.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
log_tag=images
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

busybox=/bin/busybox
# static: an ELF without a program interpreter (PT_INTERP); the image has no libraries.
static() {
  python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
phoff, = struct.unpack_from("<Q", data, 0x20)
size, count = struct.unpack_from("<HH", data, 0x36)
kinds = [struct.unpack_from("<I", data, phoff + i * size)[0] for i in range(count)]
sys.exit(0 if data[:4] == b"\x7fELF" and 3 not in kinds else 1)
PY
}
if [ ! -x "$busybox" ] || ! static "$busybox"; then
  die "a static busybox is needed at $busybox (Debian: busybox-static)"
fi
with_pause=1
[ "${1:-}" = --no-pause ] && with_pause=0
jaeger_bin=$("$repo/e2e/jaeger/build.sh" | tail -n 1)
key=$(cat "$here/images.sh" "$repo/e2e/image/oci.py" "$busybox" "$jaeger_bin/jaeger" | sha256sum | cut -c1-16)
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
out=$cache_root/nodes-images/$key
mkdir -p "$out"

oci() { python3 "$repo/e2e/image/oci.py" --arch amd64 "$@"; }

# image FILE ARGS...: writes FILE (under $out) unless it is there already.
image() {
  local file=$out/$1
  shift
  [ -s "$file" ] || oci --out "$file.tmp" "$@" >/dev/null
  [ -s "$file" ] || mv "$file.tmp" "$file"
  echo "$file"
}

upgrade_script=$(mktemp)
trap 'rm -f "$upgrade_script"' EXIT
cat >"$upgrade_script" <<'SCRIPT'
#!/bin/sh
# A Plan's upgrade: says what it upgrades, on which node, and succeeds.
echo "upgrading $SYSTEM_UPGRADE_NODE_NAME to ${SYSTEM_UPGRADE_PLAN_LATEST_VERSION:-?} ($*)"
sleep "${UPGRADE_SECONDS:-2}"
echo "upgraded"
SCRIPT

if [ "$with_pause" = 1 ]; then
  # Keyed by the pause binary too: it comes from the nodes' own build.
  nodes_bin=$("$here/build.sh" | tail -n 1)
  pause_key=$(sha256sum "$nodes_bin/pause" | cut -c1-16)
  image "pause-$pause_key.oci.tar" --ref registry.k8s.io/pause:3.10 --user 65535:65535 \
    --entrypoint /pause --file "$nodes_bin/pause=/pause:0755"
fi
image busybox.oci.tar --ref nodewarden.dev/e2e/busybox:1 --user 0:0 --entrypoint /bin/sh \
  --file "$busybox=/bin/busybox:0755" --file "$busybox=/bin/sh:0755"
image upgrade.oci.tar --ref nodewarden.dev/e2e/upgrade:v1 --user 0:0 --entrypoint /upgrade \
  --file "$busybox=/bin/busybox:0755" --file "$busybox=/bin/sh:0755" --file "$upgrade_script=/upgrade:0755"
image jaeger.oci.tar --ref docker.io/jaegertracing/jaeger:2.13.0 --user 10001:10001 \
  --entrypoint /cmd/jaeger/jaeger-linux --file "$jaeger_bin/jaeger=/cmd/jaeger/jaeger-linux:0755"
