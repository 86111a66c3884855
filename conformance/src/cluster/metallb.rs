//! MetalLB in L2 mode as the real node's load balancer ([`super::LoadBalancerKind::MetalLb`]): its
//! controller and speaker built from `go.universe.tf/metallb` (`conformance/node/build.sh`, the
//! version `conformance/node/metallb/go.mod` pins), packed by `images/build.sh
//! metallb-controller|metallb-speaker` and imported into the node's containerd, and deployed from
//! the module's own `config/manifests/metallb-native.yaml` (CRDs, RBAC, the controller Deployment,
//! the speaker DaemonSet with `hostNetwork`), changed only where this cluster needs it:
//!
//! - the images are the local ones, `imagePullPolicy: Never`;
//! - no validating webhook: the ValidatingWebhookConfiguration is left out and the controller
//!   runs with `--webhook-mode=disabled` (the webhook needs certificates the controller writes to
//!   a Secret the kubelet mounts up to a minute later; nothing here creates invalid objects);
//! - no memberlist: the speaker gets no `METALLB_ML_*` settings nor the `memberlist` Secret (it
//!   detects dead speakers between nodes; this cluster has one node).
//!
//! One [`IPAddressPool`](POOL_NAME) holds a range of each family of the cluster, inside the node's
//! uplink subnets ([`POOL_V4`], [`POOL_V6`]), so the namespace outside the node finds its
//! addresses by ARP and NDP (one pool of both families: MetalLB gives a dual-stack Service both
//! addresses from one pool only). The one L2Advertisement names the uplink ([`INTERFACE`]): the
//! speaker answers ARP and NDP there and nowhere else; it never sees the machine's interfaces (it
//! runs in the cluster's network namespace). kube-proxy forwards the traffic to the pods, as it
//! does for any load-balancer address.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::node::{self, Node};
use super::Stack;
use crate::echo::Family;
use crate::runner::kube_api::KubeApi;

/// MetalLB's namespace (its manifest's).
pub const NAMESPACE: &str = "metallb-system";
/// The pool's IPv4 range: inside the uplink's `10.255.0.0/24`.
pub const POOL_V4: &str = "10.255.0.100-10.255.0.199";
/// The pool's IPv6 range: inside the uplink's `fd00:10:255::/64`.
pub const POOL_V6: &str = "fd00:10:255::100-fd00:10:255::1ff";
/// The IPAddressPool's name.
pub const POOL_NAME: &str = "duet";
/// The one interface MetalLB announces on: the node's uplink.
pub const INTERFACE: &str = "eth0";
/// The MetalLB API version of pools and advertisements.
pub const API_VERSION: &str = "metallb.io/v1beta1";

/// How long MetalLB may take to be running (CRDs established, both pods Ready).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Deploys MetalLB on the node (images built from `bin`, written under `dir`) and waits until
/// its controller and speaker are Ready.
pub async fn deploy(
    api: &KubeApi,
    node: &Node,
    bin: &Path,
    dir: &Path,
    stack: Stack,
) -> anyhow::Result<()> {
    let module = Module::find()?;
    for part in ["controller", "speaker"] {
        let archive = dir.join(format!("metallb-{part}.tar"));
        let binary = bin.join(format!("metallb-{part}"));
        node::build_image(
            &format!("metallb-{part}"),
            &binary,
            &[&module.image(part)],
            &archive,
        )?;
        node.import_image(&archive)?;
    }
    for object in module.objects()? {
        api.apply(object).await?;
    }
    wait_crds(api).await?;
    api.apply(pool(stack)).await?;
    api.apply(advertisement()).await?;
    wait_pods(api).await
}

/// The IPAddressPool: one range per family of the cluster.
pub fn pool(stack: Stack) -> Value {
    let ranges: Vec<&str> = stack
        .families()
        .iter()
        .map(|f| match f {
            Family::V4 => POOL_V4,
            Family::V6 => POOL_V6,
        })
        .collect();
    json!({
        "apiVersion": API_VERSION, "kind": "IPAddressPool",
        "metadata": {"namespace": NAMESPACE, "name": POOL_NAME},
        "spec": {"addresses": ranges},
    })
}

/// The L2Advertisement of the pool on [`INTERFACE`] only.
pub fn advertisement() -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "L2Advertisement",
        "metadata": {"namespace": NAMESPACE, "name": POOL_NAME},
        "spec": {"ipAddressPools": [POOL_NAME], "interfaces": [INTERFACE]},
    })
}

/// The pinned MetalLB module in the Go module cache.
#[derive(Debug)]
struct Module {
    dir: PathBuf,
    version: String,
}

impl Module {
    /// `go list -m` in `conformance/node/metallb` (offline: `build.sh` downloaded it).
    fn find() -> anyhow::Result<Module> {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/metallb");
        let out = Command::new("go")
            .args(["list", "-mod=readonly", "-m", "-f", "{{.Dir}} {{.Version}}"])
            .arg("go.universe.tf/metallb")
            .current_dir(&here)
            .env("GOPROXY", "off")
            .stdin(Stdio::null())
            .output()
            .context("cannot run go (MetalLB's manifests are in its module)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.split_whitespace().collect::<Vec<_>>()[..] {
            [dir, version] if out.status.success() && !dir.is_empty() => Ok(Module {
                dir: dir.into(),
                version: version.into(),
            }),
            _ => bail!(
                "go list -m go.universe.tf/metallb in {} failed: {}",
                here.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    /// `duet.local/metallb-PART:VERSION`.
    fn image(&self, part: &str) -> String {
        format!("duet.local/metallb-{part}:{}", self.version)
    }

    /// The objects of `metallb-native.yaml`, changed for this cluster (see the module
    /// documentation).
    fn objects(&self) -> anyhow::Result<Vec<Value>> {
        let path = self.dir.join("config/manifests/metallb-native.yaml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let objects: Vec<Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("cannot parse {}", path.display()))?;
        Ok(objects
            .into_iter()
            .filter(|o| o.is_object() && o["kind"] != "ValidatingWebhookConfiguration")
            .map(|o| self.localize(o))
            .collect())
    }

    fn localize(&self, mut object: Value) -> Value {
        let part = match (object["kind"].as_str(), object["metadata"]["name"].as_str()) {
            (Some("Deployment"), Some("controller")) => "controller",
            (Some("DaemonSet"), Some("speaker")) => "speaker",
            _ => return object,
        };
        let spec = &mut object["spec"]["template"]["spec"];
        if let Some(containers) = spec["containers"].as_array_mut() {
            for container in containers {
                container["image"] = json!(self.image(part));
                container["imagePullPolicy"] = json!("Never");
                if part == "controller" {
                    push(&mut container["args"], json!("--webhook-mode=disabled"));
                } else {
                    without_memberlist(container);
                }
            }
        }
        if part == "speaker" {
            remove_named(&mut spec["volumes"], |n| n == "memberlist");
        }
        object
    }
}

/// No `METALLB_ML_*` variables and no memberlist key mount: the speaker runs without memberlist.
fn without_memberlist(container: &mut Value) {
    remove_named(&mut container["env"], |n| n.starts_with("METALLB_ML_"));
    remove_named(&mut container["volumeMounts"], |n| n == "memberlist");
}

fn push(list: &mut Value, item: Value) {
    match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    }
}

fn remove_named(list: &mut Value, unwanted: impl Fn(&str) -> bool) {
    if let Some(items) = list.as_array_mut() {
        items.retain(|i| !i["name"].as_str().is_some_and(&unwanted));
    }
}

/// Waits until MetalLB's CRDs are Established (pools and advertisements can be created).
async fn wait_crds(api: &KubeApi) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    for crd in ["ipaddresspools.metallb.io", "l2advertisements.metallb.io"] {
        loop {
            let got = api
                .get(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    crd,
                )
                .await?;
            if got.is_some_and(|c| has_condition(&c, "Established")) {
                break;
            }
            if Instant::now() > deadline {
                bail!("CRD {crd} not Established within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Waits until the controller and the speaker run Ready.
async fn wait_pods(api: &KubeApi) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    for component in ["controller", "speaker"] {
        let selector = format!("app=metallb,component={component}");
        loop {
            let pods = api.list("v1", "Pod", Some(NAMESPACE), &selector).await?;
            if pods.iter().any(|p| has_condition(p, "Ready")) {
                break;
            }
            if Instant::now() > deadline {
                let seen: Vec<&Value> = pods.iter().map(|p| &p["status"]).collect();
                bail!("MetalLB's {component} not Ready within {READY_TIMEOUT:?}: {seen:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

fn has_condition(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The interfaces MetalLB announces a Service on, from its ServiceL2Status objects.
pub async fn announcing_interfaces(api: &KubeApi, service: &str) -> anyhow::Result<Vec<String>> {
    let statuses = api
        .list(API_VERSION, "ServiceL2Status", Some(NAMESPACE), "")
        .await?;
    Ok(statuses
        .iter()
        .filter(|s| s["status"]["serviceName"] == service)
        .flat_map(|s| {
            s["status"]["interfaces"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_holds_a_range_per_family_inside_the_uplink() {
        let dual = pool(Stack::Dual);
        assert_eq!(dual["spec"]["addresses"], json!([POOL_V4, POOL_V6]));
        assert_eq!(pool(Stack::Ipv6)["spec"]["addresses"], json!([POOL_V6]));
        assert!(POOL_V4.starts_with("10.255.0.") && POOL_V6.starts_with("fd00:10:255::"));
        assert_eq!(advertisement()["spec"]["interfaces"], json!(["eth0"]));
    }

    #[test]
    fn the_speaker_loses_memberlist_and_images_are_local() {
        let module = Module {
            dir: PathBuf::new(),
            version: "v0.15.2".into(),
        };
        let speaker = json!({"kind": "DaemonSet", "metadata": {"name": "speaker"}, "spec": {"template": {"spec": {
            "containers": [{"image": "quay.io/metallb/speaker:v0.15.2",
                "env": [{"name": "METALLB_NODE_NAME"}, {"name": "METALLB_ML_BIND_ADDR"}],
                "volumeMounts": [{"name": "memberlist"}, {"name": "metallb-excludel2"}]}],
            "volumes": [{"name": "memberlist"}, {"name": "metallb-excludel2"}]}}}});
        let got = module.localize(speaker);
        let spec = &got["spec"]["template"]["spec"];
        let container = &spec["containers"][0];
        assert_eq!(container["image"], "duet.local/metallb-speaker:v0.15.2");
        assert_eq!(container["imagePullPolicy"], "Never");
        assert_eq!(container["env"], json!([{"name": "METALLB_NODE_NAME"}]));
        assert_eq!(
            container["volumeMounts"],
            json!([{"name": "metallb-excludel2"}])
        );
        assert_eq!(spec["volumes"], json!([{"name": "metallb-excludel2"}]));
    }
}
