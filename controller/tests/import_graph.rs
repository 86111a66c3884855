//! Modules import downward only: no cycle among the modules of `dataplane` or of `controller`.
//!
//! Reads every `src/**/*.rs` file of a crate, expands each `crate::…` path (including `use`
//! trees with braces) and `super::…` path, and builds two kinds of graph:
//! - the crate's top-level modules (`proxy`, `translate`, …), an edge `a -> b` when a file
//!   under `a` names `crate::b`;
//! - inside each directory module, its child modules, an edge `a -> b` when a file under
//!   `parent::a` names `crate::parent::b` or `super::b`.
//!
//! A parent module (`translate/mod.rs`) may hold the types its children share; a child naming
//! its parent is not an edge. Comments are ignored. A cycle in either graph fails the test and
//! names the modules on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path of a source file relative to `src/`: `lib.rs` is `[]`, `a/mod.rs` and `a.rs` are
/// `["a"]`, `a/b.rs` is `["a", "b"]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without `//` comments (doc comments included) and string literals' contents.
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Expands the path or use tree starting at `s` (just after `crate::` or `super::`) into its
/// full paths, each a list of segments.
fn expand(s: &str) -> Vec<Vec<String>> {
    let (paths, _) = expand_tree(s);
    paths
}

fn expand_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let s_trim = s.trim_start();
    let skipped = s.len() - s_trim.len();
    if let Some(rest) = s_trim.strip_prefix('{') {
        let mut paths = Vec::new();
        let mut i = 0;
        loop {
            let r = &rest[i..];
            let r_trim = r.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
            i += r.len() - r_trim.len();
            if r_trim.starts_with('}') || r_trim.is_empty() {
                return (paths, skipped + 1 + i + 1);
            }
            let (sub, used) = expand_tree(r_trim);
            paths.extend(sub);
            if used == 0 {
                i += r_trim.chars().next().map_or(1, char::len_utf8);
            } else {
                i += used;
            }
        }
    }
    let ident_len = s_trim.find(|c: char| !is_ident(c)).unwrap_or(s_trim.len());
    if ident_len == 0 {
        return (vec![], skipped);
    }
    let ident = s_trim[..ident_len].to_string();
    let after = &s_trim[ident_len..];
    if let Some(rest) = after.strip_prefix("::") {
        let (subs, used) = expand_tree(rest);
        let subs = if subs.is_empty() { vec![vec![]] } else { subs };
        let paths = subs
            .into_iter()
            .map(|mut p| {
                p.insert(0, ident.clone());
                p
            })
            .collect();
        (paths, skipped + ident_len + 2 + used)
    } else {
        (vec![vec![ident]], skipped + ident_len)
    }
}

/// Every path the source names after `prefix` (`crate::` or `super::`), expanded.
fn named_paths(src: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        out.extend(expand(rest));
    }
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module graphs of the crate at `src`: key "" is the top-level graph, key "a::b" the graph
/// among the children of module `a::b`.
fn graphs(src: &Path) -> BTreeMap<String, Graph> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(src).unwrap()))
        .collect();
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    for file in &files {
        let module = module_of(file.strip_prefix(src).unwrap());
        let text = strip_comments(&std::fs::read_to_string(file).expect("read source"));
        let mut targets = named_paths(&text, "crate::");
        // `super::x` from `a/b.rs` is `crate::a::x`; from `a/b/mod.rs` it is also `crate::a::x`.
        let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
        for p in named_paths(&text, "super::") {
            let mut full = parent.clone();
            full.extend(p);
            targets.push(full);
        }
        for target in targets {
            // Longest prefix of `target` that is a module of this crate.
            let target_mod: Vec<String> = (0..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|p| modules.contains(p))
                .unwrap_or_default();
            // The edge lives in the graph of the deepest common parent, between the children
            // of that parent on each side, unless one is an ancestor of the other.
            let common = module
                .iter()
                .zip(&target_mod)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= module.len() || common >= target_mod.len() {
                continue;
            }
            let key = module[..common].join("::");
            graphs
                .entry(key)
                .or_default()
                .entry(module[common].clone())
                .or_default()
                .insert(target_mod[common].clone());
        }
    }
    graphs
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a str) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on_stack.insert(v);
        if let Some(edges) = st.graph.get(v) {
            for w in edges {
                let w = w.as_str();
                if !st.index.contains_key(w) {
                    visit(st, w);
                    let lw = st.low[w];
                    let lv = st.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if st.on_stack.contains(w) {
                    let iw = st.index[w];
                    let lv = st.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut st = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out
}

fn assert_acyclic(crate_dir: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let mut found = Vec::new();
    for (parent, graph) in graphs(&src) {
        for cycle in cycles(&graph) {
            let scope = if parent.is_empty() {
                crate_dir.to_string()
            } else {
                format!("{crate_dir}::{parent}")
            };
            found.push(format!("{scope}: {}", cycle.join(" <-> ")));
        }
    }
    assert!(
        found.is_empty(),
        "import cycles (modules must import downward only):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn dataplane_modules_import_without_cycles() {
    assert_acyclic("dataplane");
}

#[test]
fn controller_modules_import_without_cycles() {
    assert_acyclic("controller");
}

#[test]
fn use_trees_expand_to_full_paths() {
    let paths = named_paths(
        "use crate::{proxy::{A, B}, upstream};\nlet x = crate::tls::load();",
        "crate::",
    );
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        ["proxy::A", "proxy::B", "upstream", "tls::load"],
        "{paths:?}"
    );
}

#[test]
fn a_cycle_is_found_and_a_chain_is_not() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert!(cycles(&g).is_empty());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c"]]);
}

/// Translation is pure: it reads the Gateway API types and the status report from
/// `gateway_api` (plain data) and never names `gateway`, the controller that does the I/O.
#[test]
fn translation_reads_the_gateway_api_types_and_never_the_gateway_controller() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = &graphs(&src)[""];
    let from_translate = &graph["translate"];
    assert!(
        from_translate.contains("gateway_api"),
        "translate names gateway_api: {from_translate:?}"
    );
    assert!(
        !from_translate.contains("gateway"),
        "translate names the gateway controller: {from_translate:?}"
    );
}

/// The functions of a crate's sources longer than `max` lines (signature to closing brace),
/// tests left out (`#[cfg(test)]` modules, which sit at the end of a file, and `tests.rs` files),
/// as `path:line name (N lines)`.
fn long_functions(crate_dir: &str, max: usize) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("tests.rs")) {
        let text = std::fs::read_to_string(file).expect("read source");
        let lines: Vec<&str> = text.lines().collect();
        let end = lines
            .windows(2)
            .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
            .unwrap_or(lines.len());
        for (name, at, len) in functions(&lines[..end]) {
            if len > max {
                let rel = file.strip_prefix(&src).unwrap().display();
                out.push(format!(
                    "{crate_dir}/src/{rel}:{} {name} ({len} lines)",
                    at + 1
                ));
            }
        }
    }
    out
}

/// Each `fn` of `lines`: its name, first line and length up to the `}` at its indentation.
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let after = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
        ]
        .iter()
        .fold(trimmed, |t, p| t.strip_prefix(p).unwrap_or(t));
        let after = after.strip_prefix("async ").unwrap_or(after);
        let Some(rest) = after.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        let close = format!("{indent}}}");
        if let Some(len) = lines[i..].iter().position(|l| *l == close) {
            // A declaration without a body (a trait's) ends at its `;` before any `{`.
            let body = lines[i..=i + len].iter().any(|l| l.contains('{'));
            let declared = lines[i..=i + len]
                .iter()
                .take_while(|l| !l.contains('{'))
                .any(|l| l.trim_end().ends_with(';'));
            if body && !declared {
                out.push((name, i, len + 1));
            }
        }
    }
    out
}

/// Functions stay short enough to read whole: at most 80 lines in the controller's and the
/// dataplane's sources (tests aside).
#[test]
fn functions_are_at_most_80_lines() {
    let long: Vec<String> = ["controller", "dataplane"]
        .iter()
        .flat_map(|c| long_functions(c, 80))
        .collect();
    assert!(
        long.is_empty(),
        "functions over 80 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn function_lengths_are_measured_to_the_closing_brace() {
    let src = "fn a() {\n    1\n}\n\n    pub async fn b(\n        x: u8,\n    ) -> u8 {\n        x\n    }\n    fn decl(&self);\n}\n";
    let lines: Vec<&str> = src.lines().collect();
    let found: Vec<(String, usize)> = functions(&lines)
        .into_iter()
        .map(|(n, _, l)| (n, l))
        .collect();
    assert_eq!(found, [("a".to_owned(), 3), ("b".to_owned(), 5)]);
}
