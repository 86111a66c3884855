//! The Gateway API suite's echo server, the real program: `echo-basic` built from the source
//! shipped in the pinned `sigs.k8s.io/gateway-api/conformance` module by
//! `conformance/gateway/build.sh` ([`build`]), run by the stand-in kubelet for every pod whose
//! container image is [`ECHO_BASIC_IMAGE`] (any tag) when the cluster was started with
//! [`super::Options::echo_basic`].
//!
//! What a container runtime and the kubelet would give it, as far as `echo-basic` uses it: the
//! container's `env` (literal values; `fieldRef`s of the downward API: `metadata.name`,
//! `metadata.namespace`, `metadata.uid`, `spec.nodeName`, `spec.serviceAccountName`,
//! `status.podIP`, `status.podIPs`, `status.hostIP`), a network namespace of its own
//! ([`super::podnet`]), and its secret and config map volumes: each is written under the cluster's folder
//! (`pods/NAMESPACE_NAME/VOLUME/`, the `items` it names or every key), and an env value naming
//! a path under the volume's `mountPath` is rewritten to that copy (no mount namespace, so the
//! program reads the copy; `echo-basic` reads its certificate files only through env values).
//! Other volumes (the service-account token) are not given. A pod whose Secret or ConfigMap does
//! not exist yet waits (`Pending`, `Ready=False`, reason `ContainerCreating`) until it does.
//! Anything else a pod asks for (another `valueFrom`, a second container) is a refusal.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::podnet::PodNet;
use super::NODE_IP_V4;
use crate::runner::kube_api::KubeApi;

/// The suite's echo server image, without tag or digest.
pub const ECHO_BASIC_IMAGE: &str = "registry.k8s.io/gateway-api/echo-basic";
/// The port `echo-basic` serves HTTP (and, with `GRPC_ECHO_SERVER`, gRPC) on by default.
const DEFAULT_PORT: u16 = 3000;
/// How long the program may take to accept connections.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The program and the folder its pods' logs and volumes go to.
#[derive(Clone, Debug)]
pub struct EchoBasic {
    /// The `echo-basic` binary.
    pub program: PathBuf,
    /// The cluster's folder (`pods/` is made in it).
    pub dir: PathBuf,
}

/// Runs `conformance/gateway/build.sh` (which reuses an up-to-date build) and returns the
/// folder holding `conformance.test`, `crds` and `echo-basic`.
pub fn build() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

/// Whether the pod's (first) container runs the suite's echo image.
pub fn runs(pod: &Value) -> bool {
    let image = pod
        .pointer("/spec/containers/0/image")
        .and_then(Value::as_str)
        .unwrap_or_default();
    image
        .strip_prefix(ECHO_BASIC_IMAGE)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':') || rest.starts_with('@'))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The value of a downward API `fieldPath`; `None` for a path this kubelet does not give.
fn field(pod: &Value, path: &str, ips: &[IpAddr]) -> Option<String> {
    let ip_list = || {
        ips.iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    Some(match path {
        "metadata.name" => str_at(pod, "/metadata/name").to_owned(),
        "metadata.namespace" => str_at(pod, "/metadata/namespace").to_owned(),
        "metadata.uid" => str_at(pod, "/metadata/uid").to_owned(),
        "spec.nodeName" => str_at(pod, "/spec/nodeName").to_owned(),
        "spec.serviceAccountName" => str_at(pod, "/spec/serviceAccountName").to_owned(),
        "status.podIP" => ips.first().map(IpAddr::to_string).unwrap_or_default(),
        "status.podIPs" => ip_list(),
        "status.hostIP" => NODE_IP_V4.to_owned(),
        _ => return None,
    })
}

/// The container's environment: literal values and downward API fields, in order.
pub fn environment(pod: &Value, ips: &[IpAddr]) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    let entries = pod
        .pointer("/spec/containers/0/env")
        .and_then(Value::as_array);
    for entry in entries.into_iter().flatten() {
        let name = str_at(entry, "/name").to_owned();
        let value = if let Some(v) = entry["value"].as_str() {
            v.to_owned()
        } else if let Some(path) = entry.pointer("/valueFrom/fieldRef/fieldPath") {
            let path = path.as_str().unwrap_or_default();
            field(pod, path, ips)
                .with_context(|| format!("env {name}: fieldRef {path} is not supported"))?
        } else if entry["valueFrom"].is_null() {
            String::new()
        } else {
            bail!("env {name}: only values and fieldRefs are supported");
        };
        env.push((name, value));
    }
    Ok(env)
}

/// The first Secret a secret volume of the pod names that does not exist (yet: the suite creates
/// some Secrets after the Deployments that mount them, and a kubelet waits for them).
pub async fn missing_secret(api: &KubeApi, pod: &Value) -> anyhow::Result<Option<String>> {
    let ns = str_at(pod, "/metadata/namespace");
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        if let Some(name) = volume.pointer("/secret/secretName").and_then(Value::as_str) {
            if api.get("v1", "Secret", Some(ns), name).await?.is_none() {
                return Ok(Some(name.to_owned()));
            }
        }
        if let Some(name) = volume.pointer("/configMap/name").and_then(Value::as_str) {
            if api.get("v1", "ConfigMap", Some(ns), name).await?.is_none() {
                return Ok(Some(format!("ConfigMap {name}")));
            }
        }
    }
    Ok(None)
}

/// Writes the pod's secret volumes under `folder` and returns (`mountPath`, copy) per mount.
async fn secret_volumes(
    api: &KubeApi,
    pod: &Value,
    folder: &Path,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let ns = str_at(pod, "/metadata/namespace");
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut mounts = Vec::new();
    let wanted = pod
        .pointer("/spec/containers/0/volumeMounts")
        .and_then(Value::as_array);
    for mount in wanted.into_iter().flatten() {
        let name = str_at(mount, "/name");
        let Some(volume) = volumes.iter().find(|v| v["name"] == name) else {
            bail!("volumeMount {name} names no volume");
        };
        // Other volumes (the service-account token every pod gets) are not given: echo-basic
        // reads none.
        let (source, data, items) = if let Some(secret_name) =
            volume.pointer("/secret/secretName").and_then(Value::as_str)
        {
            let secret = api
                .get("v1", "Secret", Some(ns), secret_name)
                .await?
                .with_context(|| format!("volume {name}: Secret {secret_name} does not exist"))?;
            let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret)?;
            let data: std::collections::BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            (
                format!("Secret {secret_name}"),
                data,
                volume.pointer("/secret/items"),
            )
        } else if let Some(map_name) = volume.pointer("/configMap/name").and_then(Value::as_str) {
            let map = api
                .get("v1", "ConfigMap", Some(ns), map_name)
                .await?
                .with_context(|| format!("volume {name}: ConfigMap {map_name} does not exist"))?;
            let map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(map)?;
            let data = map
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            (
                format!("ConfigMap {map_name}"),
                data,
                volume.pointer("/configMap/items"),
            )
        } else {
            continue;
        };
        let dir = folder.join(name);
        std::fs::create_dir_all(&dir)?;
        let items: Vec<(String, String)> = match items {
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| (str_at(i, "/key").to_owned(), str_at(i, "/path").to_owned()))
                .collect(),
            _ => data.keys().map(|k| (k.clone(), k.clone())).collect(),
        };
        for (key, path) in items {
            anyhow::ensure!(
                !path.is_empty() && !path.split('/').any(|p| p == ".." || p.is_empty()),
                "volume {name}: bad item path {path:?}"
            );
            let bytes = data
                .get(&key)
                .with_context(|| format!("volume {name}: {source} has no {key}"))?;
            let file = dir.join(&path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, bytes)?;
        }
        mounts.push((str_at(mount, "/mountPath").to_owned(), dir));
    }
    Ok(mounts)
}

/// An env value naming a path under a mount, pointed at the copy instead.
fn rewrite(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (mount_path, copy) in mounts {
        let mount_path = mount_path.trim_end_matches('/');
        if let Some(rest) = value.strip_prefix(mount_path) {
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{}{rest}", copy.display());
            }
        }
    }
    value.to_owned()
}

/// The TCP port the pod serves: its first container port, else `echo-basic`'s default.
fn served_port(pod: &Value) -> u16 {
    pod.pointer("/spec/containers/0/ports/0/containerPort")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DEFAULT_PORT)
}

impl EchoBasic {
    /// Starts the program for `pod` in `net` (addresses `ips`) and waits until it accepts
    /// connections on its port (over its IPv4 address when it has one). Fails with the end of its
    /// log if it exits first.
    pub async fn start(
        &self,
        api: &KubeApi,
        pod: &Value,
        ips: &[IpAddr],
        net: &mut PodNet,
    ) -> anyhow::Result<()> {
        let containers = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(
            containers == 1,
            "{containers} containers: echo-basic pods have one"
        );
        let folder = self.dir.join("pods").join(format!(
            "{}_{}",
            str_at(pod, "/metadata/namespace"),
            str_at(pod, "/metadata/name")
        ));
        std::fs::create_dir_all(&folder)?;
        let mounts = secret_volumes(api, pod, &folder).await?;
        let env: Vec<(String, String)> = environment(pod, ips)?
            .into_iter()
            .map(|(k, v)| {
                let v = rewrite(&v, &mounts);
                (k, v)
            })
            .collect();
        let log = folder.join("echo-basic.log");
        net.run(&self.program, &env, &log)?;
        let ip = ips.iter().find(|ip| ip.is_ipv4()).or(ips.first());
        let addr = SocketAddr::new(*ip.context("the pod has no address")?, served_port(pod));
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        loop {
            if let Some(status) = net.exited() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                bail!("echo-basic exited ({status}): {}", tail.join(" / "));
            }
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("echo-basic does not accept connections on {addr} after {LISTEN_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_echo_image_any_tag_runs_echo_basic() {
        let pod = |image: &str| json!({"spec": {"containers": [{"image": image}]}});
        assert!(runs(&pod("registry.k8s.io/gateway-api/echo-basic:v1.5.1")));
        assert!(runs(&pod(
            "registry.k8s.io/gateway-api/echo-basic@sha256:00"
        )));
        assert!(!runs(&pod("registry.k8s.io/gateway-api/echo-basic-x:v1")));
        assert!(!runs(&pod("registry.k8s.io/coredns/coredns:v1.12.2")));
        assert!(!runs(&json!({})));
    }

    #[test]
    fn env_values_and_downward_fields_are_given_others_refused() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                {"name": "GRPC_ECHO_SERVER", "value": "1"},
            ]}]},
        });
        let ips: Vec<IpAddr> = vec![
            "fd00:10:244::5".parse().unwrap(),
            "10.244.0.5".parse().unwrap(),
        ];
        let env = environment(&pod, &ips).unwrap();
        let want = [
            ("POD_NAME", "p"),
            ("NAMESPACE", "ns"),
            ("IPS", "fd00:10:244::5,10.244.0.5"),
            ("GRPC_ECHO_SERVER", "1"),
        ];
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
        let bad = json!({"spec": {"containers": [{"env": [
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}});
        assert!(environment(&bad, &ips).is_err());
        let odd = json!({"spec": {"containers": [{"env": [
            {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}}]}]}});
        assert!(environment(&odd, &ips).is_err());
    }

    #[test]
    fn paths_under_a_secret_mount_point_at_the_copy() {
        let mounts = vec![(
            "/etc/secret-volume".to_owned(),
            PathBuf::from("/tmp/c/pods/x/v"),
        )];
        assert_eq!(
            rewrite("/etc/secret-volume/crt", &mounts),
            "/tmp/c/pods/x/v/crt"
        );
        assert_eq!(
            rewrite("/etc/secret-volumes/crt", &mounts),
            "/etc/secret-volumes/crt"
        );
        assert_eq!(rewrite("1", &mounts), "1");
    }
}
