#!/usr/bin/env bash
# Builds nodewarden's container image without Docker, as an OCI image archive:
# static (musl) builds of nodewarden and nodewarden-simcloud, and the pinned
# Mozilla CA bundle (certifi.txt), in one layer on nothing else; user
# 65532:65532, entrypoint /nodewarden, command `run`; named
# ghcr.io/nodewarden/nodewarden:<crate version>. The Dockerfile builds the same
# layout for those with Docker; check.sh compares the two.
#
#   build.sh [amd64|arm64]   prints the archive's path on its last line of stdout
#
# The archive: target/image/nodewarden-<version>-linux-<arch>.oci.tar.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
log_tag=image
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

arch=${1:-amd64}
case "$arch" in
  amd64) target=x86_64-unknown-linux-musl ;;
  arm64) target=aarch64-unknown-linux-musl ;;
  *) die "usage: $0 [amd64|arm64]" ;;
esac
cache_root=${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}
# shellcheck source-path=SCRIPTDIR source=name.sh
source "$here/name.sh"
archive=$(image_archive "$arch")
mkdir -p "$(dirname "$archive")"

# --- the binaries -----------------------------------------------------------------
if ! grep -qx "$target" <<<"$(rustup target list --installed 2>/dev/null)"; then
  log "adding the Rust target $target"
  rustup target add "$target" >&2
fi
# ring's C and assembly need a C compiler for the target. For amd64 the host's
# gcc serves (ring uses no libc headers); arm64 needs a cross compiler.
case "$arch" in
  amd64)
    export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-gcc}
    ;;
  arm64)
    export CC_aarch64_unknown_linux_musl=${CC_aarch64_unknown_linux_musl:-aarch64-linux-gnu-gcc}
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER:-aarch64-linux-gnu-gcc}
    command -v "$CC_aarch64_unknown_linux_musl" >/dev/null 2>&1 ||
      die "arm64 needs a C cross compiler: $CC_aarch64_unknown_linux_musl (Debian: gcc-aarch64-linux-gnu), or set CC_aarch64_unknown_linux_musl"
    ;;
esac
log "building nodewarden and nodewarden-simcloud for $target (release) ..."
start=$(date +%s)
# Stripped by rustc, so no strip for the target is needed.
(cd "$root" && CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked \
  --target "$target" --bin nodewarden --bin nodewarden-simcloud >&2)
log "built in $(($(date +%s) - start)) s"
bin_dir="$target_dir/$target/release"

# --- the CA bundle ----------------------------------------------------------------
certs_dir="$cache_root/certifi/$(sha256sum "$here/certifi.txt" | cut -c1-16)"
if [ ! -s "$certs_dir/cacert.pem" ]; then
  log "downloading the pinned CA bundle (certifi) ..."
  mkdir -p "$certs_dir"
  python3 -m pip download --quiet --no-deps --require-hashes -r "$here/certifi.txt" -d "$certs_dir" >&2 ||
    die "pip could not download certifi (PyPI is needed once)"
  python3 - "$certs_dir" <<'PY'
import glob, sys, zipfile
d = sys.argv[1]
wheel, = glob.glob(d + "/certifi-*.whl")
with zipfile.ZipFile(wheel) as z, open(d + "/cacert.pem.tmp", "wb") as out:
    out.write(z.read("certifi/cacert.pem"))
PY
  mv "$certs_dir/cacert.pem.tmp" "$certs_dir/cacert.pem"
fi

# --- the archive ------------------------------------------------------------------
digest=$(python3 "$here/oci.py" --out "$archive" --ref "$image_ref" --arch "$arch" \
  --user 65532:65532 --entrypoint /nodewarden --cmd run \
  --file "$bin_dir/nodewarden=/nodewarden:0755" \
  --file "$bin_dir/nodewarden-simcloud=/nodewarden-simcloud:0755" \
  --file "$certs_dir/cacert.pem=/etc/ssl/certs/ca-certificates.crt:0644" \
  --label org.opencontainers.image.title=nodewarden \
  --label "org.opencontainers.image.version=$version" \
  --label org.opencontainers.image.licenses=Apache-2.0)
log "$image_ref ($arch) $digest, $(du -h "$archive" | cut -f1)"
echo "$archive"
