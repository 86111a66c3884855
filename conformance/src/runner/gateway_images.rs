//! The images of the Gateway API suite's manifests on a real node (`duet-conformance gateway
//! --real-node`): every container image the pinned suite's `base/` and `tests/` manifests name,
//! built by `images/build.sh` under exactly those references (no registry) and imported into the
//! node's containerd, where the kubelet finds them as it would after a pull.
//!
//! - `registry.k8s.io/gateway-api/echo-basic:TAG` (every tag the manifests use): the real
//!   `echo-basic`, built from the source shipped in the pinned module
//!   ([`crate::cluster::echo_basic::build`]), one image under every tag.
//! - Any other image (the base manifests' CoreDNS, the backend of the UDP profile, which duet
//!   does not claim and the runner does not run): the node's pause image under that reference.
//!   Its pod runs and is Ready, as the suite's setup requires of every pod of its namespaces, and
//!   serves nothing.
//!
//! No reference may make the kubelet pull: a container whose `imagePullPolicy` is `Always`, or
//! unset with a `:latest` or missing tag (which defaults to `Always`), fails the check.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::cluster::echo_basic::ECHO_BASIC_IMAGE;
use crate::cluster::node;

/// The folders of the suite module whose manifests the suite applies.
const MANIFEST_FOLDERS: [&str; 2] = ["base", "tests"];

/// The image references the suite's manifests name, sorted and without repeats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuiteImages {
    /// `registry.k8s.io/gateway-api/echo-basic:TAG`, each tag used.
    pub echo_basic: Vec<String>,
    /// Every other reference (CoreDNS).
    pub others: Vec<String>,
}

impl SuiteImages {
    /// Reads every YAML file under the suite module's manifest folders.
    pub fn read(module: &Path) -> anyhow::Result<SuiteImages> {
        let mut images = SuiteImages::default();
        let mut files = Vec::new();
        for folder in MANIFEST_FOLDERS {
            yaml_files(&module.join(folder), &mut files)?;
        }
        for path in files {
            let text = std::fs::read_to_string(&path)?;
            let name = path.display().to_string();
            for image in images_of(&text).with_context(|| format!("in {name}"))? {
                images.add(image);
            }
        }
        anyhow::ensure!(
            !images.echo_basic.is_empty(),
            "the suite's manifests in {} name no {ECHO_BASIC_IMAGE}",
            module.display()
        );
        Ok(images)
    }

    fn add(&mut self, image: String) {
        let list = if is_echo_basic(&image) {
            &mut self.echo_basic
        } else {
            &mut self.others
        };
        if let Err(at) = list.binary_search(&image) {
            list.insert(at, image);
        }
    }

    /// Builds the archives into `out`: echo-basic from `gateway_bin/echo-basic` under every
    /// echo-basic reference, and, when other references are named, pause from `node_bin/pause`
    /// under those. Returns their paths.
    pub fn build(
        &self,
        gateway_bin: &Path,
        node_bin: &Path,
        out: &Path,
    ) -> anyhow::Result<Vec<PathBuf>> {
        let mut archives = Vec::new();
        let mut one = |kind: &str, binary: PathBuf, refs: &[String]| -> anyhow::Result<()> {
            let archive = out.join(format!("{kind}.oci.tar"));
            let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
            node::build_image(kind, &binary, &refs, &archive)?;
            archives.push(archive);
            Ok(())
        };
        one(
            "echo-basic",
            gateway_bin.join("echo-basic"),
            &self.echo_basic,
        )?;
        if !self.others.is_empty() {
            one("pause", node_bin.join("pause"), &self.others)?;
        }
        Ok(archives)
    }

    /// What the node runs for each reference, one line each.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "images: echo-basic (built from the suite module) as {}",
            self.echo_basic.join(", ")
        )];
        if !self.others.is_empty() {
            lines.push(format!(
                "images: pause as {} (Ready, serves nothing: the UDP profile that uses it is not run)",
                self.others.join(", ")
            ));
        }
        lines
    }
}

/// The `.yaml` and `.yml` files under `dir`, at any depth.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether `image` is the suite's echo server, any tag or digest.
fn is_echo_basic(image: &str) -> bool {
    image
        .strip_prefix(ECHO_BASIC_IMAGE)
        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('@'))
}

/// The images of every container (and init container) of the manifests' objects; fails for one
/// the kubelet would pull.
fn images_of(text: &str) -> anyhow::Result<Vec<String>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).context("not YAML")?;
    let mut containers = Vec::new();
    for doc in &docs {
        collect_containers(doc, &mut containers);
    }
    let mut images = Vec::new();
    for c in containers {
        let Some(image) = c["image"].as_str() else {
            continue;
        };
        let policy = c["imagePullPolicy"].as_str();
        if pulls(image, policy) {
            bail!(
                "container {} (image {image}, imagePullPolicy {}) would be pulled from a registry",
                c["name"].as_str().unwrap_or("?"),
                policy.unwrap_or("unset")
            );
        }
        images.push(image.to_owned());
    }
    Ok(images)
}

/// Every object under a `containers` or `initContainers` key, at any depth.
fn collect_containers<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "containers" || key == "initContainers" {
                    out.extend(value.as_array().into_iter().flatten());
                } else {
                    collect_containers(value, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_containers(i, out)),
        _ => {}
    }
}

/// Whether the kubelet pulls `image` even when containerd has it: policy `Always`, or no policy
/// and a `:latest` or missing tag (the API server then defaults the policy to `Always`).
fn pulls(image: &str, policy: Option<&str>) -> bool {
    match policy {
        Some(p) => p == "Always",
        None => {
            if image.contains('@') {
                return false;
            }
            let last = image.rsplit('/').next().unwrap_or(image);
            match last.split_once(':') {
                Some((_, tag)) => tag == "latest",
                None => true,
            }
        }
    }
}

/// The folder of the `sigs.k8s.io/gateway-api/conformance` module `conformance/gateway/go.mod`
/// pins, in the Go module cache (`conformance/gateway/build.sh` downloads it).
pub fn module_dir() -> anyhow::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway");
    let out = Command::new("go")
        .args(["list", "-mod=readonly", "-m", "-f", "{{.Dir}}"])
        .arg("sigs.k8s.io/gateway-api/conformance")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .context("cannot run go list (the suite's manifests are in its Go module)")?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        bail!(
            "go list found no sigs.k8s.io/gateway-api/conformance module (run \
             conformance/gateway/build.sh): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = "\
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
        - name: a
          image: registry.k8s.io/gateway-api/echo-basic:v1.5.1
---
apiVersion: v1
kind: Pod
spec:
  initContainers:
    - name: b
      image: registry.k8s.io/coredns/coredns:v1.12.2
      imagePullPolicy: IfNotPresent
  containers:
    - name: c
      image: registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.2
---
apiVersion: v1
kind: Service
";

    #[test]
    fn every_container_image_of_every_object_is_found_and_sorted_by_kind() {
        let mut images = SuiteImages::default();
        for image in images_of(MANIFESTS).unwrap() {
            images.add(image);
        }
        images.add("registry.k8s.io/gateway-api/echo-basic:v1.5.1".to_owned());
        assert_eq!(
            images.echo_basic,
            [
                "registry.k8s.io/gateway-api/echo-basic:v1.5.1",
                "registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.2"
            ]
        );
        assert_eq!(images.others, ["registry.k8s.io/coredns/coredns:v1.12.2"]);
        assert!(!is_echo_basic(
            "registry.k8s.io/gateway-api/echo-basic-x:v1"
        ));
    }

    #[test]
    fn a_reference_the_kubelet_would_pull_is_refused() {
        assert!(pulls("registry.k8s.io/x/y:latest", None));
        assert!(pulls("registry.k8s.io/x/y", None));
        assert!(
            pulls("localhost:5000/y", None),
            "a registry port is not a tag"
        );
        assert!(pulls("registry.k8s.io/x/y:v1", Some("Always")));
        assert!(!pulls("registry.k8s.io/x/y:v1", None));
        assert!(!pulls("registry.k8s.io/x/y:latest", Some("IfNotPresent")));
        assert!(!pulls("registry.k8s.io/x/y@sha256:00", None));
        let always = "kind: Pod\nspec:\n  containers:\n    - name: x\n      image: a/b\n";
        let err = images_of(always).unwrap_err().to_string();
        assert!(
            err.contains("container x (image a/b, imagePullPolicy unset)"),
            "{err}"
        );
    }

    /// The pinned suite's own manifests, when its module is in the cache (CI builds it before
    /// the workspace tests): echo-basic under the tags they use, and CoreDNS.
    #[test]
    fn the_pinned_suite_names_echo_basic_tags_and_coredns() {
        let Ok(module) = module_dir() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "the Gateway API suite module is missing under CI"
            );
            return;
        };
        let images = SuiteImages::read(&module).unwrap();
        assert!(
            images.echo_basic.iter().all(|i| i.contains(":v1.")),
            "{images:?}"
        );
        assert!(
            images.others.iter().all(|i| i.contains("coredns")),
            "{images:?}"
        );
    }
}
