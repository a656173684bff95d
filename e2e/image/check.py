#!/usr/bin/env python3
"""Checks an image archive from build.sh as a user of the image would meet it.

- go-containerregistry's validators read it as an OCI image layout and as a
  `docker save` tarball (every digest, size and diff ID);
- the config: user 65532:65532, entrypoint ["/nodewarden"], command ["run"],
  the architecture asked for;
- the root file system: exactly the files the Dockerfile's final stage
  copies, no shell, every ELF file static (no program interpreter);
- the Dockerfile's final stage: the same user, entrypoint and command;
- the binaries run from the unpacked root as user 65532 (in a chroot when
  run as root, so nothing of the host's file system serves them; an image
  of another architecture through qemu-user's static emulator when it is
  installed): `nodewarden --version` names the crate version, `nodewarden
  crds` prints manifests/base/crds.yaml, `nodewarden-simcloud --help`
  answers.

  check.py ARCHIVE ARCH VALIDATOR REPOSITORY:TAG
"""

import json
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
USER = "65532:65532"
SHELLS = {"bin/sh", "bin/bash", "bin/ash", "bin/busybox", "usr/bin/sh", "usr/bin/bash"}

failures = []


def expect(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def blob(layout, digest):
    algorithm, hexdigest = digest.split(":", 1)
    return os.path.join(layout, "blobs", algorithm, hexdigest)


def dockerfile_final_stage(path):
    """(destination files, USER, ENTRYPOINT, CMD) of the last stage."""
    lines, current = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            current += line.rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                lines.append(current.strip())
                current = ""
    stage = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stage = []
        stage.append(line)
    files, user, entrypoint, cmd = set(), None, None, None
    for line in stage:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "COPY":
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            files.add(args[-1].lstrip("/"))
        elif word == "USER":
            user = rest.strip()
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
    return files, user, entrypoint, cmd


def interpreter(path):
    """The ELF program interpreter of a file, "" for a static ELF, None for no ELF."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        endian = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack(endian + "Q", head[32:40])
        phentsize, phnum = struct.unpack(endian + "HH", head[54:58])
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack(endian + "IIQQQQ", f.read(40))
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return ""


def emulator(arch):
    """None on a host of `arch`; else qemu-user's static emulator for it, or "" when absent."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    if platform.machine() == machine:
        return None
    for name in (f"qemu-{machine}-static", f"qemu-{machine}"):
        path = shutil.which(name)
        if path:
            return path
    return ""


def run_in_root(rootfs, argv, qemu):
    """Runs argv from the unpacked root as user 65532; returns (status, stdout, how)."""
    if qemu:
        # A static emulator runs a static binary without anything of the root.
        command = ["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", qemu,
                   os.path.join(rootfs, argv[0].lstrip("/"))] + argv[1:]
        if os.geteuid() != 0:
            command = command[4:]
    elif os.geteuid() == 0:
        command = ["chroot", "--userspec=" + USER, rootfs] + argv
    else:
        command = [os.path.join(rootfs, argv[0].lstrip("/"))] + argv[1:]
    # The host's tools by their full path; the image's process sees no PATH of the host.
    command[0] = shutil.which(command[0]) or command[0]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={"PATH": "/"})
    how = "qemu-user as 65532" if qemu else ("chroot as 65532" if os.geteuid() == 0 else "as this user")
    return done.returncode, done.stdout, how


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    archive, arch, validator, ref = sys.argv[1:]
    version = ref.rpartition(":")[2]
    work = tempfile.mkdtemp(prefix="nodewarden-image-")
    # User 65532 runs the binaries from here (through qemu-user, by their path).
    os.chmod(work, 0o755)
    layout, rootfs = os.path.join(work, "layout"), os.path.join(work, "rootfs")
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")

    done = subprocess.run([validator, layout, archive, ref], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    expect(done.returncode == 0, "go-containerregistry validates the OCI layout and the docker-save form"
           + ("" if done.returncode == 0 else ": " + done.stderr.strip()))

    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    expect(len(index["manifests"]) == 1, "index.json holds one manifest")
    entry = index["manifests"][0]
    expect(entry["annotations"].get("io.containerd.image.name") == ref, f"containerd names it {ref}")
    with open(blob(layout, entry["digest"])) as f:
        manifest = json.load(f)
    with open(blob(layout, manifest["config"]["digest"])) as f:
        config = json.load(f)
    runtime = config["config"]
    expect(config["architecture"] == arch and config["os"] == "linux", f"platform linux/{arch}")
    expect(runtime.get("User") == USER, f"user {USER} (got {runtime.get('User')!r})")
    expect(runtime.get("Entrypoint") == ["/nodewarden"], f"entrypoint [/nodewarden] (got {runtime.get('Entrypoint')})")
    expect(runtime.get("Cmd") == ["run"], f"command [run] (got {runtime.get('Cmd')})")

    os.mkdir(rootfs)
    for layer in manifest["layers"]:
        with tarfile.open(blob(layout, layer["digest"])) as tar:
            tar.extractall(rootfs, filter="data")
    files = set()
    for base, _, names in os.walk(rootfs):
        for name in names:
            files.add(os.path.relpath(os.path.join(base, name), rootfs))
    expect(not files & SHELLS, "no shell in the image")
    for name in sorted(files):
        interp = interpreter(os.path.join(rootfs, name))
        if interp is not None:
            expect(interp == "", f"/{name} is a static executable" + (f" (interpreter {interp})" if interp else ""))

    docker_files, docker_user, docker_entrypoint, docker_cmd = dockerfile_final_stage(os.path.join(ROOT, "Dockerfile"))
    expect(docker_files == files, f"the Dockerfile's final stage copies the same files ({sorted(docker_files)} vs {sorted(files)})")
    expect(docker_user == USER, f"the Dockerfile's USER is {USER} (got {docker_user!r})")
    expect(docker_entrypoint == runtime.get("Entrypoint"), "the Dockerfile's ENTRYPOINT is the image's")
    expect(docker_cmd == runtime.get("Cmd"), "the Dockerfile's CMD is the image's")

    qemu = emulator(arch)
    if qemu == "":
        print(f"skip  running the binaries: a linux/{arch} image on a {platform.machine()} host without qemu-user")
    else:
        status, out, how = run_in_root(rootfs, ["/nodewarden", "--version"], qemu)
        expect(status == 0 and version in out, f"`nodewarden --version` runs ({how}): {out.strip()!r}")
        status, out, how = run_in_root(rootfs, ["/nodewarden", "crds"], qemu)
        with open(os.path.join(ROOT, "manifests/base/crds.yaml")) as f:
            expect(status == 0 and out == f.read(), f"`nodewarden crds` ({how}) prints manifests/base/crds.yaml")
        status, out, how = run_in_root(rootfs, ["/nodewarden-simcloud", "--help"], qemu)
        expect(status == 0, f"`nodewarden-simcloud --help` runs ({how})")

    subprocess.run(["rm", "-rf", work], check=False)
    if failures:
        sys.exit(f"image check: {len(failures)} failed")
    print(f"image check: {archive} passed")


if __name__ == "__main__":
    main()
