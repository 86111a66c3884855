//! Request mirrors (Gateway API `RequestMirror`), by outcome.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::registry::Registry;

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// What became of a mirror the route's sampling chose (the `outcome` of
/// `duet_request_mirrors_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorOutcome {
    /// Sent, and the mirror backend answered (the answer is discarded).
    Answered,
    /// Sent or tried, and no answer came (connect failure, timeout, no target).
    Failed,
    /// Not sent: the per-process limit of mirrors in flight was reached.
    Shed,
    /// Not sent: the request has a body (only bodyless requests are mirrored), asks for an
    /// upgrade, or the mirror backend speaks TLS.
    Skipped,
}

impl MirrorOutcome {
    const ALL: [MirrorOutcome; 4] = [
        MirrorOutcome::Answered,
        MirrorOutcome::Failed,
        MirrorOutcome::Shed,
        MirrorOutcome::Skipped,
    ];

    fn label(self) -> &'static str {
        match self {
            MirrorOutcome::Answered => "answered",
            MirrorOutcome::Failed => "failed",
            MirrorOutcome::Shed => "shed",
            MirrorOutcome::Skipped => "skipped",
        }
    }
}

/// The family of mirrors.
#[derive(Clone, Debug)]
pub(super) struct MirrorFamilies {
    mirrors: Series<OutcomeLabels, Counter>,
}

impl MirrorFamilies {
    pub(super) fn register(registry: &mut Registry) -> MirrorFamilies {
        let f = MirrorFamilies {
            mirrors: Series::default(),
        };
        for outcome in MirrorOutcome::ALL {
            let _ = f.mirrors.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        registry.register(
            "duet_request_mirrors",
            "Request mirrors (RequestMirror filter) by outcome: answered, failed, shed (too many in flight), skipped (a body, an upgrade or a TLS mirror backend)",
            f.mirrors.clone(),
        );
        f
    }
}

impl Metrics {
    /// Counts one mirror by what became of it.
    pub fn mirror(&self, outcome: MirrorOutcome) {
        self.mirrors
            .mirrors
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// The mirrors counted with `outcome` so far.
    pub fn mirrors(&self, outcome: MirrorOutcome) -> u64 {
        self.mirrors
            .mirrors
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .get()
    }
}
