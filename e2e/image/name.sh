# What the image is called and where its archive goes, for build.sh and
# check.sh (sourced; they set root, the repository's top, and source
# ../lib.sh first). Sets version (the crate's), image_ref
# (ghcr.io/nodewarden/nodewarden:<version>, the name the chart and the
# manifests use) and target_dir; `image_archive ARCH` prints the archive's path.
# shellcheck shell=bash
# The sourcing script sets root and reads what this sets:
# shellcheck disable=SC2034,SC2154

version=$(sed -n 's/^version = "\(.*\)"$/\1/p;T;q' "$root/Cargo.toml")
[ -n "$version" ] || die "no version in Cargo.toml"
image_ref="ghcr.io/nodewarden/nodewarden:$version"
target_dir=${CARGO_TARGET_DIR:-$root/target}

image_archive() { echo "$target_dir/image/nodewarden-$version-linux-$1.oci.tar"; }
