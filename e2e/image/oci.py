#!/usr/bin/env python3
"""Writes a single-layer container image as an OCI image archive, without Docker.

The archive is an OCI image layout in a tar (index.json, oci-layout,
blobs/sha256/...) that `skopeo copy oci-archive:` and containerd's import
(`kind load image-archive`, `ctr images import`) read, and it also carries the
manifest.json of `docker save`, so `docker load` reads it on Docker versions
before and after 25. The archive depends on its files alone: every time
stamp is SOURCE_DATE_EPOCH (default 0) and every owner is root.

  oci.py --out X.oci.tar --ref REPO:TAG --arch amd64 --user 65532:65532 \
         --entrypoint /nodewarden --cmd run \
         --file SRC=/DST:MODE ... [--label K=V ...]
  oci.py --out Y.oci.tar --ref REPO:TAG2 --arch amd64 --from X.oci.tar [--label K=V ...]

With --from, the layer, user, entrypoint, command and labels are those of an
archive this script wrote; the options given replace them (labels are added).
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"


def tar_info(name, size=0, mode=0o644, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.type = kind
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def parse_file(spec):
    """SRC=/DST:MODE -> (src, dst without the leading slash, mode)."""
    try:
        src, rest = spec.split("=", 1)
        dst, mode = rest.rsplit(":", 1)
        mode = int(mode, 8)
    except ValueError:
        sys.exit(f"oci.py: --file {spec!r}: expected SRC=/DST:MODE (octal mode)")
    if not dst.startswith("/") or dst.endswith("/") or ".." in dst.split("/"):
        sys.exit(f"oci.py: --file {spec!r}: the destination must be an absolute file path")
    if not os.path.isfile(src):
        sys.exit(f"oci.py: --file {spec!r}: {src} is not a file")
    return src, dst.lstrip("/"), mode


def layer_tar(files):
    """The layer: each file and the directories above it, in sorted order."""
    dirs = set()
    for _, dst, _ in files:
        parts = dst.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    entries = [(d + "/", None, 0o755) for d in dirs] + [(dst, src, mode) for src, dst, mode in files]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, src, mode in sorted(entries):
            if src is None:
                tar.addfile(tar_info(name, mode=mode, kind=tarfile.DIRTYPE))
            else:
                with open(src, "rb") as f:
                    tar.addfile(tar_info(name, os.path.getsize(src), mode), f)
    return buf.getvalue()


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=EPOCH, compresslevel=9) as gz:
        gz.write(data)
    return buf.getvalue()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_archive(path):
    """(layer tar, image config) of a single-layer archive this script wrote."""
    with tarfile.open(path) as outer:
        def blob(digest):
            return outer.extractfile("blobs/sha256/" + digest.split(":", 1)[1]).read()
        index = json.loads(outer.extractfile("index.json").read())
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        if len(manifest["layers"]) != 1:
            sys.exit(f"oci.py: --from {path}: {len(manifest['layers'])} layers, expected one")
        layer = gzip.decompress(blob(manifest["layers"][0]["digest"]))
        return layer, json.loads(blob(manifest["config"]["digest"]))["config"]


def image_content(args):
    """(layer tar, user, entrypoint, cmd, labels): from --file, or from --from."""
    labels = dict(label.split("=", 1) for label in args.label)
    if args.source is None:
        if not args.file or not args.user or not args.entrypoint:
            sys.exit("oci.py: --file, --user and --entrypoint are required without --from")
        return layer_tar(args.file), args.user, args.entrypoint, args.cmd, labels
    if args.file:
        sys.exit("oci.py: --from takes the files of its archive: no --file with it")
    layer, base = read_archive(args.source)
    return (layer, args.user or base["User"], args.entrypoint or base["Entrypoint"],
            args.cmd or base.get("Cmd") or [], {**(base.get("Labels") or {}), **labels})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ref", required=True, help="repository:tag the loaders name the image")
    parser.add_argument("--arch", required=True, choices=["amd64", "arm64"])
    parser.add_argument("--user")
    parser.add_argument("--entrypoint", action="append")
    parser.add_argument("--cmd", action="append", default=[])
    parser.add_argument("--file", action="append", type=parse_file)
    parser.add_argument("--from", dest="source", help="an archive this script wrote, to re-tag or re-label")
    parser.add_argument("--label", action="append", default=[])
    args = parser.parse_args()

    repository, sep, tag = args.ref.rpartition(":")
    if not sep or "/" in tag or not repository:
        sys.exit(f"oci.py: --ref {args.ref!r}: expected repository:tag")
    layer, user, entrypoint, cmd, labels = image_content(args)
    created = datetime.datetime.fromtimestamp(EPOCH, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    layer_gz = gzip_bytes(layer)
    config = canonical({
        "architecture": args.arch,
        "os": "linux",
        "created": created,
        "config": {
            "User": user,
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer)]},
        "history": [{"created": created, "created_by": "e2e/image/oci.py"}],
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": sha256(config), "size": len(config)},
        "layers": [{"mediaType": LAYER, "digest": sha256(layer_gz), "size": len(layer_gz)}],
        "annotations": {"org.opencontainers.image.version": labels.get("org.opencontainers.image.version", tag)},
    })
    index = canonical({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": sha256(manifest),
            "size": len(manifest),
            "platform": {"architecture": args.arch, "os": "linux"},
            "annotations": {
                # containerd's import names the image by this one ...
                "io.containerd.image.name": args.ref,
                # ... skopeo's oci-archive:<file>:<tag> by this one.
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })

    def blob(data):
        return "blobs/sha256/" + hashlib.sha256(data).hexdigest()

    # docker load (before Docker 25 it reads only this file).
    docker_manifest = canonical([{
        "Config": blob(config),
        "RepoTags": [args.ref],
        "Layers": [blob(layer_gz)],
    }])
    members = [
        ("blobs/", None),
        ("blobs/sha256/", None),
        (blob(config), config),
        (blob(layer_gz), layer_gz),
        (blob(manifest), manifest),
        ("index.json", index),
        ("manifest.json", docker_manifest),
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
    ]
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            if data is None:
                tar.addfile(tar_info(name, mode=0o755, kind=tarfile.DIRTYPE))
            else:
                tar.addfile(tar_info(name, len(data)), io.BytesIO(data))
    os.replace(tmp, args.out)
    print(sha256(manifest))


if __name__ == "__main__":
    main()
