//! The container images `images/build.sh` makes (OCI image archives, no daemon, no registry),
//! read back with `images/oci.py inspect`, which checks every digest: duet's image has the
//! layout of the root Dockerfile's final stage (binary path, user, entrypoint, command, ports,
//! working directory, environment); every image holds what its binary needs (the libraries
//! `ldd` names, the CA bundle, passwd and group with nonroot 65532, its home and /tmp); the same
//! inputs give the same digest; the layer's own loader and libraries run the binary; the
//! echo-basic image carries the names the Gateway API suite's manifests use.
//!
//! The binaries are the ones cargo builds for the tests (`duet-echo` stands in for `duet` where
//! only the layout matters), so no release build is needed. Needs python3, objcopy (binutils),
//! ldd and Debian's ca-certificates (test.sh installs them), and Go for the echo-basic image.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context};
use conformance::cluster::echo_basic;
use serde_json::Value;

const ECHO: &str = env!("CARGO_BIN_EXE_duet-echo");
const USER: &str = "65532:65532";
const PASSWD_NONROOT: &str = "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin";
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the conformance crate")
        .to_path_buf()
}

/// Runs `program args...` and returns its stdout, or an error with its stderr.
fn run(program: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;
    ensure!(
        out.status.success(),
        "{} {args:?} failed ({}): {}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `images/build.sh KIND --binary BINARY --out OUT`; the archive path it prints last.
fn build(kind: &str, binary: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let script = repo().join("images/build.sh");
    let args = [kind, "--binary", path_str(binary), "--out", path_str(out)];
    let stdout = run(&script, &args)?;
    let printed = PathBuf::from(stdout.lines().last().unwrap_or_default());
    ensure!(printed == out, "build.sh printed {printed:?}, not {out:?}");
    Ok(printed)
}

/// `repository` of the root Cargo.toml's `[workspace.package]`.
fn workspace_repository() -> String {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    let line = manifest
        .lines()
        .find_map(|l| l.strip_prefix("repository = "));
    line.expect("a repository").trim_matches('"').to_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// An image archive as `images/oci.py inspect` reads it.
struct Image(Value);

impl Image {
    fn read(archive: &Path) -> anyhow::Result<Self> {
        let oci = repo().join("images/oci.py");
        let json = run(&oci, &["inspect", path_str(archive)])?;
        Ok(Image(serde_json::from_str(&json)?))
    }

    fn config(&self) -> &Value {
        &self.0["config"]["config"]
    }

    fn digest(&self) -> &str {
        self.0["manifest_digest"].as_str().unwrap_or_default()
    }

    /// The `io.containerd.image.name` of each index entry, with its `ref.name` checked.
    fn refs(&self) -> Vec<String> {
        let entries = self.0["index"]["manifests"].as_array().expect("manifests");
        entries
            .iter()
            .map(|m| {
                let name = m["annotations"]["io.containerd.image.name"].as_str();
                let name = name.expect("a containerd image name").to_owned();
                let tag = m["annotations"]["org.opencontainers.image.ref.name"].as_str();
                assert_eq!(Some(name.rsplit(':').next().unwrap()), tag, "{m}");
                name
            })
            .collect()
    }

    fn entry(&self, path: &str) -> &Value {
        let layer = self.0["layer"].as_array().expect("layer entries");
        let found = layer.iter().find(|e| e["path"] == path);
        found.unwrap_or_else(|| panic!("{path} is not in the layer"))
    }

    fn paths(&self) -> BTreeSet<String> {
        let layer = self.0["layer"].as_array().expect("layer entries");
        layer
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// The files `ldd` names for a binary (libraries and loader), without the leading `/`.
fn ldd_files(binary: &Path) -> BTreeSet<String> {
    let out = Command::new("ldd").arg(binary).output().expect("ldd runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files = BTreeSet::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let path = match words.as_slice() {
            [_, "=>", path, ..] | [path, ..] if path.starts_with('/') => path,
            _ => continue,
        };
        files.insert(path.trim_start_matches('/').to_owned());
    }
    files
}

/// What every image holds, whatever its binary.
fn assert_runtime_files(image: &Image, name: &str, binary: &Path) {
    let libs = ldd_files(binary);
    assert_binary_and_libraries(image, name, &libs);
    let mut files = vec![CA_BUNDLE, "etc/passwd", "etc/group"];
    files.push("usr/share/doc/ca-certificates/copyright");
    if !libs.is_empty() {
        files.push("usr/share/doc/libc6/copyright");
    }
    for file in files {
        assert_eq!(image.entry(file)["type"], "file", "{file}");
        assert_eq!(image.entry(file)["mode"], 0o644, "{file}");
    }
    assert_owners_and_times(image);
}

/// The binary (an executable file owned by root) and every library ldd names, as real files.
fn assert_binary_and_libraries(image: &Image, name: &str, libs: &BTreeSet<String>) {
    let bin = image.entry(&format!("usr/local/bin/{name}"));
    let kind = (bin["type"].as_str(), bin["mode"].as_u64());
    assert_eq!(kind, (Some("file"), Some(0o755)), "{bin}");
    let paths = image.paths();
    for lib in libs {
        assert!(paths.contains(lib), "{lib} (ldd) is not in the layer");
        assert_eq!(image.entry(lib)["type"], "file", "{lib} is not a file");
    }
}

/// Root owns everything but nonroot's home; /tmp is 1777; every mtime is 0.
fn assert_owners_and_times(image: &Image) {
    let home = image.entry("home/nonroot");
    let owner = (home["uid"].as_u64(), home["gid"].as_u64());
    assert_eq!(owner, (Some(65532), Some(65532)));
    assert_eq!(image.entry("tmp")["mode"], 0o1777);
    for entry in image.0["layer"].as_array().unwrap() {
        assert_eq!(entry["mtime"], 0, "{entry}");
        let owned = entry["path"] == "home/nonroot";
        assert!(owned || entry["uid"] == 0 && entry["gid"] == 0, "{entry}");
    }
}

/// Unpacks the archive's layer into a folder of `dir`.
fn unpack(archive: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    run(
        &repo().join("images/oci.py"),
        &["extract", path_str(archive), path_str(&rootfs)],
    )?;
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd"))?;
    assert!(passwd.lines().any(|l| l == PASSWD_NONROOT), "{passwd}");
    let group = std::fs::read_to_string(rootfs.join("etc/group"))?;
    assert!(group.lines().any(|l| l == "nonroot:x:65532:"), "{group}");
    Ok(rootfs)
}

fn strings(value: &Value) -> Vec<String> {
    let items = value.as_array().into_iter().flatten();
    items
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect()
}

fn ports(config: &Value) -> BTreeSet<String> {
    let ports = config["ExposedPorts"].as_object().into_iter().flatten();
    ports.map(|(port, _)| port.clone()).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The instructions of a Dockerfile's final stage: (INSTRUCTION, arguments), continuation lines
/// joined, comments dropped.
fn final_stage(dockerfile: &str) -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                let (op, args) = pending.split_once(' ').unwrap_or((&pending, ""));
                instructions.push((op.to_uppercase(), args.trim().to_owned()));
                pending.clear();
            }
        }
    }
    let last_from = instructions.iter().rposition(|(op, _)| op == "FROM");
    instructions.split_off(last_from.expect("a FROM") + 1)
}

/// The final stage's (single) argument of an instruction.
fn instruction<'a>(stage: &'a [(String, String)], op: &str) -> &'a str {
    let mut found = stage.iter().filter(|(o, _)| o == op);
    let (_, args) = found
        .next()
        .unwrap_or_else(|| panic!("no {op} in the final stage"));
    assert!(
        found.next().is_none(),
        "{op} appears twice in the final stage"
    );
    args
}

/// EXPOSE's ports as the image config names them (`8080` is `8080/tcp`).
fn exposed(args: &str) -> BTreeSet<String> {
    let with_protocol = |p: &str| {
        let tcp = if p.contains('/') { "" } else { "/tcp" };
        format!("{p}{tcp}")
    };
    args.split_whitespace().map(with_protocol).collect()
}

/// The Dockerfile's final stage gives the image config `images/build.sh` wrote.
fn assert_dockerfile_matches(config: &Value, image: &Image) {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("the root Dockerfile");
    let stage = final_stage(&text);
    let exec_form = |op| -> Vec<String> {
        serde_json::from_str(instruction(&stage, op)).expect("exec (JSON) form")
    };
    assert_eq!(instruction(&stage, "USER"), config["User"], "USER");
    assert_eq!(
        exec_form("ENTRYPOINT"),
        strings(&config["Entrypoint"]),
        "ENTRYPOINT"
    );
    assert_eq!(exec_form("CMD"), strings(&config["Cmd"]), "CMD");
    assert_eq!(
        instruction(&stage, "WORKDIR"),
        config["WorkingDir"],
        "WORKDIR"
    );
    let expose = exposed(instruction(&stage, "EXPOSE"));
    assert_eq!(expose, ports(config), "EXPOSE");
    let env = instruction(&stage, "ENV");
    assert!(
        strings(&config["Env"]).iter().any(|e| e == env),
        "ENV {env}"
    );
    let copy_dest = instruction(&stage, "COPY")
        .split_whitespace()
        .last()
        .unwrap();
    assert_eq!(
        Some(copy_dest),
        config["Entrypoint"][0].as_str(),
        "COPY destination"
    );
    image.entry(copy_dest.trim_start_matches('/'));
}

#[test]
fn duet_image_has_the_dockerfile_layout() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let archive = build("duet", Path::new(ECHO), &dir.path().join("duet.oci.tar"))?;
    let image = Image::read(&archive)?;
    let config = image.config();
    assert_eq!(image.refs(), ["duet.local/duet:dev"]);
    assert_eq!(config["User"], USER);
    assert_eq!(strings(&config["Entrypoint"]), ["/usr/local/bin/duet"]);
    assert_eq!(strings(&config["Cmd"]), ["serve"]);
    assert_eq!(ports(config), set(&["8080/tcp", "8443/tcp", "10254/tcp"]));
    assert_eq!(config["WorkingDir"], "/");
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        workspace_repository()
    );
    assert_runtime_files(&image, "duet", Path::new(ECHO));
    assert_dockerfile_matches(config, &image);
    unpack(&archive, dir.path())?;
    Ok(())
}

#[test]
fn echo_image_is_deterministic_and_runs_on_its_own_libraries() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let first = build("echo", Path::new(ECHO), &dir.path().join("a.oci.tar"))?;
    let second = build("echo", Path::new(ECHO), &dir.path().join("b.oci.tar"))?;
    let image = Image::read(&first)?;
    assert_eq!(image.digest(), Image::read(&second)?.digest());
    assert!(
        std::fs::read(&first)? == std::fs::read(&second)?,
        "archives differ"
    );
    assert_eq!(image.refs(), ["duet.local/duet-echo:dev"]);
    let config = image.config();
    assert_eq!(config["User"], USER);
    assert_eq!(strings(&config["Entrypoint"]), ["/usr/local/bin/duet-echo"]);
    assert!(config["Cmd"].is_null(), "{config}");
    assert_eq!(ports(config), set(&["3000/tcp"]));
    assert_runtime_files(&image, "duet-echo", Path::new(ECHO));
    // The layer's own loader runs the layer's binary, the layer's libraries first on its path.
    let rootfs = unpack(&first, dir.path())?;
    let libs = rootfs.join("lib/x86_64-linux-gnu");
    let bin = rootfs.join("usr/local/bin/duet-echo");
    let args = [
        "--library-path",
        path_str(&libs),
        path_str(&bin),
        "--version",
    ];
    let version = run(&rootfs.join("lib64/ld-linux-x86-64.so.2"), &args)?;
    assert_eq!(
        version.trim(),
        format!("duet-echo {}", env!("CARGO_PKG_VERSION"))
    );
    Ok(())
}

#[test]
fn echo_basic_image_has_the_names_the_suite_uses() -> anyhow::Result<()> {
    let binary = echo_basic::build()?.join("echo-basic");
    let dir = tempfile::tempdir()?;
    let archive = build(
        "echo-basic",
        &binary,
        &dir.path().join("echo-basic.oci.tar"),
    )?;
    let image = Image::read(&archive)?;
    let refs = image.refs();
    // base/manifests.yaml of the pinned suite runs most of its backends as v1.5.1.
    let main = format!("{}:v1.5.1", echo_basic::ECHO_BASIC_IMAGE);
    assert!(refs.contains(&main), "{refs:?}");
    for name in &refs {
        let pod = serde_json::json!({"spec": {"containers": [{"image": name}]}});
        assert!(
            echo_basic::runs(&pod),
            "{name} is not the suite's echo image"
        );
    }
    let config = image.config();
    assert_eq!(config["User"], USER);
    assert_eq!(
        strings(&config["Entrypoint"]),
        ["/usr/local/bin/echo-basic"]
    );
    assert_eq!(ports(config), set(&["3000/tcp", "3001/tcp", "8443/tcp"]));
    assert!(
        ldd_files(&binary).is_empty(),
        "echo-basic is built static (CGO_ENABLED=0)"
    );
    assert_runtime_files(&image, "echo-basic", &binary);
    unpack(&archive, dir.path())?;
    Ok(())
}
