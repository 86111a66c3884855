//! The reference pages of the book (`docs/src/reference/`) and the chart's README, rendered from
//! the code they describe: the command line from clap, annotations and diagnostics from their
//! tables, metrics from the registry, access-log fields from the writer's table, chart values from
//! their `# --` comments. `docs/generate-reference.sh` writes them; a test fails when a file in
//! the repository differs from what the code renders.

mod annotations;
mod chart;
mod cli;
mod diagnostics;
mod logs;
mod metrics;

use std::path::Path;

/// The command that rewrites every page.
pub const REGENERATE: &str = "docs/generate-reference.sh";

/// One generated file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Its path from the repository root.
    pub path: &'static str,
    /// Its content.
    pub text: String,
}

/// Every generated page; `root` is the repository (the chart pages read `charts/duet/`).
pub fn pages(root: &Path) -> Result<Vec<Page>, String> {
    let values = chart::Chart::read(&root.join("charts/duet"))?;
    let page = |path, text| Page { path, text };
    Ok(vec![
        page("docs/src/reference/index.md", index()),
        page("docs/src/reference/cli.md", cli::page()),
        page("docs/src/reference/annotations.md", annotations::duet()),
        page(
            "docs/src/reference/ingress-nginx-annotations.md",
            annotations::nginx(),
        ),
        page("docs/src/reference/metrics.md", metrics::page()),
        page("docs/src/reference/access-log.md", logs::page()),
        page("docs/src/reference/diagnostics.md", diagnostics::page()),
        page("docs/src/reference/chart-values.md", values.page()),
        page("charts/duet/README.md", values.readme()),
    ])
}

/// The reference pages with one line each.
const INDEX: [(&str, &str, &str); 7] = [
    (
        "Command line",
        "cli.md",
        "every `duet` command and flag, with its default",
    ),
    (
        "Annotations",
        "annotations.md",
        "duet's own `duet.dev/` annotations",
    ),
    (
        "ingress-nginx annotations",
        "ingress-nginx-annotations.md",
        "what duet does with each `nginx.ingress.kubernetes.io/` key",
    ),
    (
        "Metrics",
        "metrics.md",
        "every metric on `/metrics`, with its type and labels",
    ),
    (
        "Access log",
        "access-log.md",
        "every field of the JSON access log",
    ),
    (
        "Diagnostics",
        "diagnostics.md",
        "every diagnostic reason, what it means and how to fix it",
    ),
    (
        "Chart values",
        "chart-values.md",
        "every value of the Helm chart",
    ),
];

fn index() -> String {
    let mut out = head(
        "Reference",
        "Pages generated from the code, so they always describe the build they come with.",
    );
    for (title, file, what) in INDEX {
        out.push_str(&format!("- [{title}]({file}): {what}.\n"));
    }
    out
}

/// A page's title, the generated-file note and its introduction.
fn head(title: &str, intro: &str) -> String {
    format!("# {title}\n\n<!-- Generated from the code by {REGENERATE}: do not edit. -->\n\n{intro}\n\n")
}

/// A Markdown table.
fn table<R: IntoIterator<Item = Vec<String>>>(header: &[&str], rows: R) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// Text fit for one table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    words.join(" ").replace('|', "\\|")
}

/// `text` in backticks (empty stays empty).
fn code(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("`{text}`")
    }
}
