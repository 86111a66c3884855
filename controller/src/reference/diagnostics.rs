//! `diagnostics.md`: every diagnostic [`Reason`] with its Event type, meaning and fix.

use super::{code, head, table};
use crate::events::ACTION;
use crate::metrics::DIAGNOSTICS_METRIC;
use crate::translate::Reason;

pub(super) fn page() -> String {
    let mut out = head(
        "Diagnostics",
        &format!(
            "When part of an object cannot be served as written, duet skips that part, serves \
             the rest and reports a diagnostic: in its log, on `/debug/routes`, in the \
             `{DIAGNOSTICS_METRIC}` gauge by reason and, in Kubernetes mode, as an Event on the \
             object (written by the leader, once per problem, action `{ACTION}`, reason as \
             below). `kubectl get events --field-selector reason=MissingService` lists one kind."
        ),
    );
    // Anchors for `{{#include reference/diagnostics.md:reasons}}` from other pages.
    out.push_str("<!-- ANCHOR: reasons -->\n");
    let rows = Reason::ALL.iter().map(|r| {
        vec![
            code(r.as_str()),
            r.event_type().as_str().to_owned(),
            r.meaning().to_owned(),
            r.fix().to_owned(),
        ]
    });
    out.push_str(&table(
        &["Reason", "Event type", "What it means", "How to fix it"],
        rows,
    ));
    out.push_str("<!-- ANCHOR_END: reasons -->\n");
    out
}
