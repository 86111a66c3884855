#!/usr/bin/env python3
"""OCI image archives without a daemon or a registry (python3 standard library only).

    oci.py pack ROOTFS --out FILE --ref REF [--ref REF...] [--owner PATH=UID:GID...]
                [--user U] [--entrypoint ARG...] [--cmd ARG...] [--port 8080/tcp...]
                [--env K=V...] [--workdir DIR] [--label K=V...] [--created-by TEXT]
    oci.py inspect FILE      prints the index, manifest, config and layer entries as JSON
    oci.py extract FILE DIR  unpacks the image's layer into DIR

`pack` writes a tar of an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`)
holding one image: its config, its manifest and one gzip layer made of ROOTFS. The layer is
deterministic: entries sorted by path, mtime 0, owner 0:0 except the paths given by --owner,
modes as found in ROOTFS, no user or group names; the gzip stream has no name and mtime 0. The
same ROOTFS and flags give the same bytes, so the same digests. Each --ref (`host/path:tag`)
becomes one entry of index.json naming the one manifest, annotated with
`org.opencontainers.image.ref.name` (the tag) and `io.containerd.image.name` (the whole ref), the
name `ctr images import` gives it. `inspect` checks every digest and size it reads.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile

EPOCH = "1970-01-01T00:00:00Z"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
PLATFORM = {"architecture": "amd64", "os": "linux"}


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def descriptor(media_type, data):
    return {"mediaType": media_type, "digest": sha256(data), "size": len(data)}


# --------------------------------------------------------------------------------------------
# pack


def tar_entry(rootfs, rel, owners):
    """The TarInfo of ROOTFS/rel, normalised (no times, no names, owner from owners or 0:0)."""
    path = os.path.join(rootfs, rel)
    st = os.lstat(path)
    info = tarfile.TarInfo(rel)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = 0
    info.uid, info.gid = owners.get(rel, (0, 0))
    info.uname = info.gname = ""
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    else:
        sys.exit(f"oci.py: {path} is neither a file, a folder nor a symlink")
    return info


def layer_tar(rootfs, owners):
    """The uncompressed layer: every path under rootfs, sorted."""
    paths = []
    for top, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            paths.append(os.path.relpath(os.path.join(top, name), rootfs))
    unknown = set(owners) - set(paths)
    if unknown:
        sys.exit(f"oci.py: --owner names paths not in the rootfs: {sorted(unknown)}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(paths):
            info = tar_entry(rootfs, rel, owners)
            if info.isreg():
                with open(os.path.join(rootfs, rel), "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return buf.getvalue()


def image_config(args, diff_id):
    config = {"User": args.user, "WorkingDir": args.workdir}
    if args.env:
        config["Env"] = args.env
    if args.entrypoint:
        config["Entrypoint"] = args.entrypoint
    if args.cmd:
        config["Cmd"] = args.cmd
    if args.port:
        config["ExposedPorts"] = {port: {} for port in args.port}
    if args.label:
        config["Labels"] = dict(pair(label, "--label") for label in args.label)
    return {
        **PLATFORM,
        "created": EPOCH,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": EPOCH, "created_by": args.created_by}],
    }


def pair(text, flag):
    key, sep, value = text.partition("=")
    if not sep or not key:
        sys.exit(f"oci.py: {flag} {text!r} is not KEY=VALUE")
    return key, value


def ref_entry(manifest_desc, ref):
    """One index.json entry: the manifest named ref (host/path:tag)."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not name:
        sys.exit(f"oci.py: --ref {ref!r} has no tag (host/path:tag)")
    annotations = {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
    return {**manifest_desc, "platform": PLATFORM, "annotations": annotations}


def owners_of(specs):
    owners = {}
    for spec in specs:
        path, ids = pair(spec, "--owner")
        uid, _, gid = ids.partition(":")
        owners[path.strip("/")] = (int(uid), int(gid or uid))
    return owners


def add_bytes(tar, name, data, mode=0o644):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar, name):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def write_archive(out, blobs, index):
    """The OCI layout as one tar, entries sorted, written next to out and renamed over it."""
    files = {"oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), "index.json": canonical(index)}
    for data in blobs:
        files["blobs/sha256/" + sha256(data).removeprefix("sha256:")] = data
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_dir(tar, "blobs")
        add_dir(tar, "blobs/sha256")
        for name in sorted(files):
            add_bytes(tar, name, files[name])
    os.replace(tmp, out)


def pack(args):
    raw = layer_tar(args.rootfs, owners_of(args.owner))
    layer = gzip_bytes(raw)
    config = canonical(image_config(args, sha256(raw)))
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": descriptor(MEDIA_CONFIG, config),
            "layers": [descriptor(MEDIA_LAYER, layer)],
        }
    )
    manifest_desc = descriptor(MEDIA_MANIFEST, manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [ref_entry(manifest_desc, ref) for ref in args.ref],
    }
    write_archive(args.out, [config, manifest, layer], index)
    print(f"oci.py: {args.out}: manifest {manifest_desc['digest']}, layer {len(layer)} bytes", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# inspect, extract


def read_layout(path):
    """index, manifest, config and layer bytes of the archive's one image, digests checked."""
    with tarfile.open(path) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isreg()}

        def blob(desc):
            name = "blobs/" + desc["digest"].replace(":", "/")
            data = tar.extractfile(members[name]).read()
            if sha256(data) != desc["digest"] or len(data) != desc["size"]:
                sys.exit(f"oci.py: {path}: {name} does not match its descriptor")
            return data

        layout = json.loads(tar.extractfile(members["oci-layout"]).read())
        index = json.loads(tar.extractfile(members["index.json"]).read())
        digests = {m["digest"] for m in index["manifests"]}
        if len(digests) != 1:
            sys.exit(f"oci.py: {path}: index.json names {len(digests)} manifests, not one")
        manifest = json.loads(blob(index["manifests"][0]))
        config = json.loads(blob(manifest["config"]))
        layer = gzip.decompress(blob(manifest["layers"][0]))
    if config["rootfs"]["diff_ids"] != [sha256(layer)]:
        sys.exit(f"oci.py: {path}: the config's diff_id is not the layer's digest")
    return {"oci-layout": layout, "index": index, "manifest": manifest, "config": config}, layer


def layer_entries(layer):
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return [
            {
                "path": m.name,
                "type": "dir" if m.isdir() else "symlink" if m.issym() else "file" if m.isreg() else "other",
                "mode": m.mode,
                "uid": m.uid,
                "gid": m.gid,
                "size": m.size,
                "linkname": m.linkname,
                "mtime": m.mtime,
            }
            for m in tar.getmembers()
        ]


def inspect(args):
    image, layer = read_layout(args.archive)
    image["manifest_digest"] = image["index"]["manifests"][0]["digest"]
    image["layer"] = layer_entries(layer)
    json.dump(image, sys.stdout, indent=1, sort_keys=True)
    print()


def extract(args):
    _, layer = read_layout(args.archive)
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(args.dir, filter="fully_trusted")
        else:
            tar.extractall(args.dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="write an OCI image archive of a root filesystem")
    p.add_argument("rootfs")
    p.add_argument("--out", required=True)
    p.add_argument("--ref", action="append", required=True, help="host/path:tag, repeatable")
    p.add_argument("--owner", action="append", default=[], help="PATH=UID:GID, repeatable")
    p.add_argument("--user", default="0:0")
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--port", action="append", default=[], help="PORT/PROTO, repeatable")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="/")
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--created-by", default="images/oci.py pack")
    p.set_defaults(run=pack)
    p = sub.add_parser("inspect", help="print an archive's image as JSON")
    p.add_argument("archive")
    p.set_defaults(run=inspect)
    p = sub.add_parser("extract", help="unpack an archive's layer into a folder")
    p.add_argument("archive")
    p.add_argument("dir")
    p.set_defaults(run=extract)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
