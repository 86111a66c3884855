//! `metrics.md`: every metric family as the registry describes it (name, type, unit, help), with
//! the labels of [`dataplane::metrics::LABELS`] and [`crate::metrics::LABELS`].

use prometheus_client::registry::Registry;

use super::{code, head, table, REGENERATE};
use crate::metrics::{ControllerMetrics, BUILD_BUCKETS, LABELS as CONTROLLER_LABELS};
use dataplane::metrics::{Metrics, LABELS, LATENCY_BUCKETS};

/// One family as the text exposition describes it.
#[derive(Debug, Default)]
struct Described {
    name: String,
    kind: String,
    help: String,
}

/// The families of a registry holding both the dataplane's (one series each) and the
/// controller's, as `duet` registers them, in the order `/metrics` shows them.
fn described() -> Vec<Described> {
    let mut registry = Registry::default();
    let _dataplane = Metrics::specimen(&mut registry);
    let _controller = ControllerMetrics::register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("encoding into a String does not fail");
    let mut families: Vec<Described> = Vec::new();
    for line in text.lines() {
        let Some((what, rest)) = line.strip_prefix("# ").and_then(|l| l.split_once(' ')) else {
            continue;
        };
        let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
        if families.last().is_none_or(|f| f.name != name) {
            families.push(Described {
                name: name.to_owned(),
                ..Described::default()
            });
        }
        let family = families.last_mut().expect("pushed above");
        match what {
            "HELP" => family.help = value.to_owned(),
            "TYPE" => family.kind = value.to_owned(),
            _ => {}
        }
    }
    families
}

/// The series name a family's samples carry (`_total` for counters).
fn exposed(family: &Described) -> String {
    match family.kind.as_str() {
        "counter" => format!("{}_total", family.name),
        _ => family.name.clone(),
    }
}

fn labels(name: &str) -> String {
    let labels = LABELS
        .iter()
        .chain(CONTROLLER_LABELS.iter())
        .find(|(family, _)| *family == name)
        .map(|(_, labels)| *labels)
        .unwrap_or_else(|| {
            panic!("{name}: not in a LABELS table of the metrics modules: add it, then run {REGENERATE}")
        });
    let labels: Vec<String> = labels.iter().map(|l| code(l)).collect();
    labels.join(", ")
}

fn buckets(bounds: &[f64]) -> String {
    let bounds: Vec<String> = bounds.iter().map(f64::to_string).collect();
    bounds.join(", ")
}

pub(super) fn page() -> String {
    let mut out = head(
        "Metrics",
        "duet serves its metrics in the Prometheus text format on `/metrics` of the admin \
         listener (`--admin-listen`: port 10254, on loopback by default; the chart opens it on \
         the pod's addresses). Label values are bounded: hosts as written in \
         the routing table (never the Host header), nine methods plus `other`, families `ipv4` \
         and `ipv6` (`none`: answered without an upstream). A route's series leave the \
         exposition when the route leaves the table.",
    );
    let rows = described().into_iter().map(|f| {
        let labels = labels(&f.name);
        vec![code(&exposed(&f)), f.kind, labels, f.help]
    });
    out.push_str(&table(&["Metric", "Type", "Labels", "Description"], rows));
    out.push_str(&format!(
        "\nHistogram buckets, in seconds: request and upstream latencies {}; snapshot builds {}.\n",
        buckets(&LATENCY_BUCKETS),
        buckets(&BUILD_BUCKETS)
    ));
    out
}
