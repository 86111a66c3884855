//! The controller's metrics: how long building and applying a snapshot takes, and the current
//! configuration diagnostics by reason. Registered next to the dataplane's families.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::translate::nginx::{self, Status};
use crate::translate::{AnnotationReport, Diagnostic, Reason};

/// Buckets of the snapshot build histogram, in seconds: 0.5 ms to 10 s.
pub const BUILD_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The gauge of current diagnostics by reason.
pub const DIAGNOSTICS_METRIC: &str = "duet_config_diagnostics";

/// The labels of every family [`ControllerMetrics::register`] registers, by the family's name as
/// exposed (a test holds it to what the families write; the metrics reference is rendered from
/// the registry and this table).
pub const LABELS: [(&str, &[&str]); 3] = [
    ("duet_snapshot_build_seconds", &[]),
    ("duet_config_diagnostics", &["reason"]),
    ("duet_ingress_annotations", &["status"]),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

/// The controller's metric families.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    build: Histogram,
    diagnostics: Family<ReasonLabels, Gauge>,
    annotations: Family<StatusLabels, Gauge>,
}

impl ControllerMetrics {
    /// Creates the families and registers them.
    pub fn register(registry: &mut Registry) -> ControllerMetrics {
        let m = ControllerMetrics {
            build: Histogram::new(BUILD_BUCKETS),
            diagnostics: Family::default(),
            annotations: Family::default(),
        };
        registry.register_with_unit(
            "duet_snapshot_build",
            "Time to translate the stored objects into a routing snapshot and apply it, per published snapshot",
            Unit::Seconds,
            m.build.clone(),
        );
        registry.register(
            DIAGNOSTICS_METRIC,
            "Configuration problems in the live snapshot (objects or parts of objects skipped), by reason",
            m.diagnostics.clone(),
        );
        registry.register(
            "duet_ingress_annotations",
            "nginx.ingress.kubernetes.io/ annotations of the served Ingresses, by what duet does with them (honoured, honoured-with-difference, ignored-unsupported, ignored-unknown, ignored-removed-upstream, invalid-value)",
            m.annotations.clone(),
        );
        m.set_diagnostics(&[]);
        m.set_annotations(&[]);
        m
    }

    /// Sets the annotation gauges from the current reports (every status, zero when absent).
    pub fn set_annotations(&self, reports: &[AnnotationReport]) {
        let counts = nginx::count_by_status(reports.iter().flat_map(|r| &r.annotations));
        for status in Status::ALL {
            self.annotations
                .get_or_create(&StatusLabels {
                    status: status.as_str(),
                })
                .set(counts[&status] as i64);
        }
    }

    /// Records the build time of a published snapshot.
    pub fn observe_build(&self, took: Duration) {
        self.build.observe(took.as_secs_f64());
    }

    /// Sets the diagnostic gauges from the current set (every reason, zero when absent).
    pub fn set_diagnostics(&self, all: &[Diagnostic]) {
        for reason in Reason::ALL {
            let n = all.iter().filter(|d| d.reason == reason).count();
            self.diagnostics
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .set(n as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{Kind, ObjectKey};

    #[test]
    fn labels_table_matches_the_families_written() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.observe_build(Duration::from_millis(3));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let table: Vec<&str> = LABELS.iter().map(|(name, _)| *name).collect();
        assert_eq!(families, table, "LABELS (metrics.rs) lists other families");
        for (family, labels) in LABELS {
            let sample = text
                .lines()
                .find(|l| l.starts_with(family) && !l.contains("le=\""))
                .unwrap_or_else(|| panic!("{family}: no series: {text}"));
            let written: Vec<&str> = sample
                .split_once('{')
                .map(|(_, l)| l.split(',').filter_map(|p| p.split_once('=')).map(|p| p.0))
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(
                written, labels,
                "{family}: LABELS (metrics.rs) differs: {sample}"
            );
        }
    }

    #[test]
    fn diagnostics_by_reason_and_build_time() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        let d = |reason| Diagnostic::new(ObjectKey::new(Kind::Ingress, "a", "b"), reason, "x");
        m.set_diagnostics(&[
            d(Reason::MissingService),
            d(Reason::MissingService),
            d(Reason::InvalidPath),
        ]);
        m.observe_build(Duration::from_millis(3));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"duet_config_diagnostics{reason="MissingService"} 2"#,
            r#"duet_config_diagnostics{reason="InvalidPath"} 1"#,
            r#"duet_config_diagnostics{reason="ConflictingPath"} 0"#,
            "duet_snapshot_build_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        m.set_diagnostics(&[]);
        text.clear();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"duet_config_diagnostics{reason="MissingService"} 0"#),
            "{text}"
        );
    }
}
