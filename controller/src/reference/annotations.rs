//! `annotations.md` from [`DUET_ANNOTATIONS`], and `ingress-nginx-annotations.md` from the
//! ingress-nginx catalogue.

use super::{code, head, table};
use crate::translate::nginx::{
    Status, Support, ALIASES, CONFIGMAP_ONLY, KEYS, PREFIX, REMOVED, SNIPPET_NOTE,
};
use crate::translate::DUET_ANNOTATIONS;

pub(super) fn duet() -> String {
    let mut out = head(
        "Annotations",
        "duet's own annotations, set on an Ingress (`duet.dev/upstream-family` also on an \
         HTTPRoute or GRPCRoute). An invalid value is an `InvalidAnnotation` diagnostic naming \
         the annotation, what is wrong and what applies instead; the object is still served. \
         Where a `duet.dev/` annotation and its `nginx.ingress.kubernetes.io/` twin are both \
         set, the `duet.dev/` one wins. The ingress-nginx annotations duet reads are listed in \
         [ingress-nginx annotations](ingress-nginx-annotations.md).",
    );
    let rows = DUET_ANNOTATIONS.iter().map(|a| {
        vec![
            code(a.name),
            a.value.to_owned(),
            a.default.to_owned(),
            a.meaning.to_owned(),
        ]
    });
    out.push_str(&table(
        &["Annotation", "Value", "Without it", "What it does"],
        rows,
    ));
    out
}

/// The status a key of each kind of support gets in `duet migrate check`, the
/// `duet_ingress_annotations` metric and the Ingress's report (when its value is valid).
fn status(support: Support) -> (Status, &'static str) {
    match support {
        Support::Honoured => (Status::Honoured, ""),
        Support::Different(difference) => (Status::HonouredWithDifference, difference),
        Support::Unsupported(note) => (Status::IgnoredUnsupported, note),
        Support::Snippet => (Status::IgnoredUnsupported, SNIPPET_NOTE),
    }
}

pub(super) fn nginx() -> String {
    let mut out = head(
        "ingress-nginx annotations",
        &format!(
            "What duet does with each `{PREFIX}` key of ingress-nginx's final release. The \
             status is the one `duet migrate check`, the `duet_ingress_annotations` metric and \
             the `IgnoredAnnotation` diagnostics report for a valid value; a value that does not \
             parse is `invalid-value` and the default applies."
        ),
    );
    out.push_str(&counts());
    out.push_str("\n## Keys\n\n");
    let rows = KEYS.iter().map(|k| {
        let (status, note) = status(k.support);
        let status = match k.support {
            Support::Snippet => format!("{} (snippet)", code(status.as_str())),
            _ => code(status.as_str()),
        };
        vec![code(k.name), status, note.to_owned()]
    });
    out.push_str(&table(&["Key", "Status", "Difference or note"], rows));
    out.push_str("\n## Aliases\n\nThe alias applies when its key is absent.\n\n");
    let rows = ALIASES
        .iter()
        .map(|(alias, key)| vec![code(alias), code(key)]);
    out.push_str(&table(&["Alias", "Key"], rows));
    out.push_str(&format!(
        "\n## Keys ingress-nginx removed\n\nStill found in manifests; reported as `{}`.\n\n",
        Status::IgnoredRemovedUpstream
    ));
    let rows = REMOVED
        .iter()
        .map(|(k, note)| vec![code(k), (*note).to_owned()]);
    out.push_str(&table(&["Key", "What happened to it"], rows));
    out.push_str(&format!(
        "\n## ConfigMap options written as annotations\n\nNever annotations of ingress-nginx; \
         reported as `{}`.\n\n",
        Status::IgnoredUnknown
    ));
    let rows = CONFIGMAP_ONLY
        .iter()
        .map(|(k, note)| vec![code(k), (*note).to_owned()]);
    out.push_str(&table(&["Key", "Note"], rows));
    out
}

/// The number of keys per status, and how many are snippets.
fn counts() -> String {
    let mut rows = Vec::new();
    for s in Status::ALL {
        let n = KEYS.iter().filter(|k| status(k.support).0 == s).count();
        if n > 0 {
            rows.push(vec![code(s.as_str()), n.to_string()]);
        }
    }
    let snippets = KEYS
        .iter()
        .filter(|k| k.support == Support::Snippet)
        .count();
    rows.push(vec!["of which snippets".to_owned(), snippets.to_string()]);
    rows.push(vec!["all keys".to_owned(), KEYS.len().to_string()]);
    table(&["Status", "Keys"], rows)
}
