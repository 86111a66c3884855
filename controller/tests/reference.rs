//! The generated reference pages in the repository are what the code renders today: a flag,
//! metric, annotation, diagnostic, access-log field or chart value changed without regenerating
//! fails here, naming the page and the command that rewrites it.

use std::path::Path;

use controller::reference::{pages, REGENERATE};

#[test]
fn reference_pages_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = Vec::new();
    for page in pages(&root).expect("the chart's files are readable") {
        let on_disk = std::fs::read_to_string(root.join(page.path)).unwrap_or_default();
        if on_disk != page.text {
            let first = first_difference(&on_disk, &page.text);
            stale.push(format!("{} is stale ({first})", page.path));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nrun {REGENERATE} and commit the result",
        stale.join("\n")
    );
}

/// The first line that differs, as `line N: in the file ... / from the code ...`.
fn first_difference(on_disk: &str, rendered: &str) -> String {
    let mut disk = on_disk.lines();
    for (n, want) in rendered.lines().enumerate() {
        let got = disk.next();
        if got != Some(want) {
            return format!(
                "line {}: in the file {:?}, from the code {want:?}",
                n + 1,
                got.unwrap_or("(missing)")
            );
        }
    }
    format!("the file has lines after line {}", rendered.lines().count())
}
