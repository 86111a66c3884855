//! The live snapshot: its version, when it was applied, and when each served certificate
//! expires (read by [`crate::x509::not_after`]).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::Metrics;
use crate::table::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SecretLabels {
    secret: Arc<str>,
}

/// The families of the snapshot and its certificates.
#[derive(Clone, Debug)]
pub(super) struct SnapshotFamilies {
    snapshot_version: Gauge,
    snapshot_applied: Gauge<f64, AtomicU64>,
    tls_expiry: Series<SecretLabels, Gauge>,
}

impl SnapshotFamilies {
    pub(super) fn register(registry: &mut Registry) -> SnapshotFamilies {
        let f = SnapshotFamilies {
            snapshot_version: Gauge::default(),
            snapshot_applied: Gauge::default(),
            tls_expiry: Series::default(),
        };
        registry.register(
            "duet_snapshot_version",
            "Version of the live routing snapshot",
            f.snapshot_version.clone(),
        );
        registry.register_with_unit(
            "duet_snapshot_applied_timestamp",
            "Unix time at which the live routing snapshot was applied",
            Unit::Seconds,
            f.snapshot_applied.clone(),
        );
        registry.register_with_unit(
            "duet_tls_certificate_expiry_timestamp",
            "Unix time at which a served TLS certificate expires, by Secret (namespace/name)",
            Unit::Seconds,
            f.tls_expiry.clone(),
        );
        f
    }
}

impl Metrics {
    /// Records a snapshot as applied now: version, time and certificate expiries (when its
    /// certificates changed). Its targets by kind are counted, when scraped, from the snapshot
    /// [`Metrics::set_backend_targets`] was given.
    pub fn snapshot_applied(&self, snapshot: &Snapshot, certs_changed: bool) {
        let s = &self.snapshot;
        s.snapshot_version.set(snapshot.version as i64);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        s.snapshot_applied.set(now.as_secs_f64());
        if certs_changed {
            self.clear_certificate_expiries();
            for cert in snapshot.certs.certs() {
                let leaf = cert
                    .key
                    .cert
                    .first()
                    .and_then(|c| crate::x509::not_after(c));
                if let Some(expires) = leaf {
                    self.set_certificate_expiry(&cert.source, expires);
                }
            }
        }
    }

    /// Sets the expiry time of the certificate of a TLS Secret (`namespace/name`).
    pub fn set_certificate_expiry(&self, secret: &str, expires: SystemTime) {
        let at = expires
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.snapshot
            .tls_expiry
            .get_or_create(&SecretLabels {
                secret: secret.into(),
            })
            .set(at);
    }

    /// Forgets every certificate expiry (before setting those of a new certificate table).
    pub fn clear_certificate_expiries(&self) {
        self.snapshot.tls_expiry.clear();
    }
}
