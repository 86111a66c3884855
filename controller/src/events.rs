//! Kubernetes Events (`events.k8s.io/v1`) for Ingresses duet cannot serve fully: one Warning per
//! new diagnostic (missing Service, unknown port, missing Secret, conflicting path, ...), with
//! the translation [`Reason`](crate::translate::Reason) as its reason. The control loop hands
//! over the whole current set of diagnostics whenever it changes; the recorder publishes those it
//! has not published as leader yet, so an unchanged problem is reported once, not at every
//! rebuild. Only the leader records, so replicas do not repeat each other, and a replica that
//! becomes leader reports the problems that already exist (the old leader's Events may have
//! expired, and its instance is gone).

use std::collections::BTreeSet;

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Resource as _;
use tokio::sync::{mpsc, watch};

use crate::index::Kind;
use crate::source::kube::Stores;
use crate::translate::Diagnostic;

/// The action named in every Event.
pub const ACTION: &str = "Route";

/// Starts the recorder: diagnostics from `rx`, Ingresses looked up in `stores`.
pub fn spawn(
    client: kube::Client,
    instance: String,
    stores: Stores,
    mut rx: mpsc::UnboundedReceiver<Vec<Diagnostic>>,
    mut leading: watch::Receiver<bool>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "duet".to_owned(),
            instance: Some(instance),
        },
    );
    tokio::spawn(async move {
        let mut current: BTreeSet<Diagnostic> = BTreeSet::new();
        // What this replica published as leader and is still current.
        let mut published: BTreeSet<Diagnostic> = BTreeSet::new();
        loop {
            tokio::select! {
                batch = rx.recv() => match batch {
                    Some(all) => current = all.into_iter().filter(|d| d.object.kind == Kind::Ingress).collect(),
                    None => return,
                },
                changed = leading.changed() => if changed.is_err() { return },
            }
            if !*leading.borrow_and_update() {
                published.clear();
                continue;
            }
            published.retain(|d| current.contains(d));
            for diagnostic in current.iter().filter(|d| !published.contains(*d)) {
                let Some(ingress) =
                    stores.ingress(&diagnostic.object.namespace, &diagnostic.object.name)
                else {
                    continue;
                };
                let reference = ingress.object_ref(&());
                let event = Event {
                    type_: EventType::Warning,
                    reason: diagnostic.reason.as_str().to_owned(),
                    note: Some(truncate(&diagnostic.message, 1024)),
                    action: ACTION.to_owned(),
                    secondary: None,
                };
                match recorder.publish(&event, &reference).await {
                    Ok(()) => {
                        tracing::debug!(object = %diagnostic.object, reason = %diagnostic.reason, "Event recorded")
                    }
                    Err(error) => {
                        tracing::warn!(object = %diagnostic.object, %error, "Event not recorded")
                    }
                }
            }
            published.clone_from(&current);
        }
    });
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
}
