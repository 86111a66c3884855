//! Kubernetes Events (`events.k8s.io/v1`) for objects duet cannot serve fully: one Warning per
//! new diagnostic of an Ingress (missing Service, unknown port, missing Secret, conflicting path,
//! ...) or of an EndpointSlice (a dropped endpoint address, an unknown port, ...), with the
//! translation [`Reason`](crate::translate::Reason) as its reason.
//!
//! The control loop hands over the whole current set of diagnostics whenever it changes, through
//! a `watch` channel: a queue of one that holds only the latest set, so a new set replaces a
//! stale one and nothing piles up while the API is slow. The recorder publishes what it has not
//! published as leader yet, so an unchanged problem is reported once, not at every rebuild. A
//! write that fails (or takes longer than [`WRITE_TIMEOUT`]) is retried with back-off
//! ([`RetryBackoff`]: 0.5 s doubling to 30 s), as long as the problem is still current; a problem
//! resolved meanwhile is dropped. Only the leader records, so replicas do not repeat each other,
//! and a replica that becomes leader reports the problems that already exist (the old leader's
//! Events may have expired, and its instance is gone).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::object::Kind;
use crate::source::kube::Stores;
use crate::translate::{Diagnostic, DiagnosticEventType};
use crate::units::Doubling;

/// The action named in every Event.
pub const ACTION: &str = "Route";

/// The longest one Event write may take before it counts as failed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The Kubernetes client's Event type for a diagnostic's.
fn event_type(kind: DiagnosticEventType) -> EventType {
    match kind {
        DiagnosticEventType::Normal => EventType::Normal,
        DiagnosticEventType::Warning => EventType::Warning,
    }
}

/// The current diagnostics, latest set only (the sender side lives in the control loop).
pub type DiagnosticSets = watch::Receiver<Arc<Vec<Diagnostic>>>;

/// The delays between retries of failed writes: 0.5 s doubling up to 30 s, reset by a pass
/// that writes everything.
#[derive(Clone, Debug)]
pub struct RetryBackoff(Doubling);

impl RetryBackoff {
    /// The first delay.
    pub const MIN: Duration = Duration::from_millis(500);
    /// The longest delay.
    pub const MAX: Duration = Duration::from_secs(30);

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        self.0.next_delay()
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.0.reset();
    }
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff(Doubling::new(Self::MIN, Self::MAX))
    }
}

/// Whether diagnostics of this kind become Events.
fn reported(diagnostic: &Diagnostic) -> bool {
    matches!(diagnostic.object.kind, Kind::Ingress | Kind::EndpointSlice)
}

/// Starts the recorder: diagnostics from `sets`, Ingresses looked up in `stores`.
pub fn spawn(
    client: kube::Client,
    instance: String,
    stores: Stores,
    sets: DiagnosticSets,
    leading: watch::Receiver<bool>,
) {
    let writer = Writer {
        client,
        reporter: Reporter {
            controller: "duet".to_owned(),
            instance: Some(instance),
        },
        stores,
    };
    tokio::spawn(writer.run(sets, leading));
}

struct Writer {
    client: kube::Client,
    reporter: Reporter,
    stores: Stores,
}

impl Writer {
    async fn run(self, mut sets: DiagnosticSets, mut leading: watch::Receiver<bool>) {
        let mut current: BTreeSet<Diagnostic> = BTreeSet::new();
        // What this replica published as leader and is still current.
        let mut published: BTreeSet<Diagnostic> = BTreeSet::new();
        let mut backoff = RetryBackoff::default();
        let mut retry_at: Option<Instant> = None;
        loop {
            tokio::select! {
                changed = sets.changed() => {
                    if changed.is_err() { return }
                    current = sets.borrow_and_update().iter().filter(|d| reported(d)).cloned().collect();
                }
                changed = leading.changed() => if changed.is_err() { return },
                () = sleep_until(retry_at), if retry_at.is_some() => retry_at = None,
            }
            if !*leading.borrow_and_update() {
                published.clear();
                retry_at = None;
                backoff.reset();
                continue;
            }
            published.retain(|d| current.contains(d));
            if retry_at.is_some() {
                continue; // backing off: the new set waits for the retry
            }
            match self
                .publish_new(&current, &mut published, &sets, &leading)
                .await
            {
                Pass::Done => backoff.reset(),
                Pass::Interrupted => {}
                Pass::Failed => {
                    let delay = backoff.next_delay();
                    tracing::info!(retry_in = ?delay, "Event writes failed; retrying");
                    retry_at = Some(Instant::now() + delay);
                }
            }
        }
    }

    /// Publishes every current diagnostic not published yet, until one write fails or a newer
    /// set (or a leadership change) arrives.
    async fn publish_new(
        &self,
        current: &BTreeSet<Diagnostic>,
        published: &mut BTreeSet<Diagnostic>,
        sets: &DiagnosticSets,
        leading: &watch::Receiver<bool>,
    ) -> Pass {
        let new: Vec<&Diagnostic> = current.iter().filter(|d| !published.contains(*d)).collect();
        for diagnostic in new {
            if sets.has_changed().unwrap_or(true) || leading.has_changed().unwrap_or(true) {
                return Pass::Interrupted;
            }
            let Some(reference) = self.reference(diagnostic) else {
                continue; // not cached yet: tried again with the next set
            };
            let event = Event {
                type_: event_type(diagnostic.reason.event_type()),
                reason: diagnostic.reason.as_str().to_owned(),
                note: Some(truncate(&diagnostic.message, 1024)),
                action: ACTION.to_owned(),
                secondary: None,
            };
            // A recorder per Event: kube's recorder folds Events with the same object and reason
            // into one series keeping the first note, and this writer already reports each
            // problem once.
            let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            match tokio::time::timeout(WRITE_TIMEOUT, recorder.publish(&event, &reference)).await {
                Ok(Ok(())) => {
                    tracing::debug!(object = %diagnostic.object, reason = %diagnostic.reason, "Event recorded");
                    published.insert(diagnostic.clone());
                }
                Ok(Err(error)) => {
                    tracing::warn!(object = %diagnostic.object, %error, "Event not recorded");
                    return Pass::Failed;
                }
                Err(_) => {
                    tracing::warn!(object = %diagnostic.object, timeout = ?WRITE_TIMEOUT, "Event not recorded: timed out");
                    return Pass::Failed;
                }
            }
        }
        Pass::Done
    }

    /// The object an Event is about: the cached Ingress, or the EndpointSlice by name.
    fn reference(&self, diagnostic: &Diagnostic) -> Option<ObjectReference> {
        let object = &diagnostic.object;
        match object.kind {
            Kind::Ingress => self
                .stores
                .ingress(&object.namespace, &object.name)
                .map(|ingress| ingress.object_ref()),
            Kind::EndpointSlice => Some(ObjectReference {
                api_version: Some("discovery.k8s.io/v1".to_owned()),
                kind: Some("EndpointSlice".to_owned()),
                namespace: Some(object.namespace.clone()),
                name: Some(object.name.clone()),
                ..Default::default()
            }),
            _ => None,
        }
    }
}

/// How a pass over the current set ended.
enum Pass {
    /// Everything current is published.
    Done,
    /// A newer set or a leadership change came first.
    Interrupted,
    /// A write failed: retry after a back-off.
    Failed,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_a_char_boundary() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate(&"x".repeat(2000), 1024).len(), 1024);
    }

    #[test]
    fn retries_back_off_to_thirty_seconds_and_reset() {
        let mut b = RetryBackoff::default();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        b.reset();
        assert_eq!(b.next_delay(), RetryBackoff::MIN);
    }
}
