//! Manifest YAML built straight from the YAML parser's events into `serde_json::Value`s, for the
//! plain YAML that manifests are made of; anything else is left to serde-saphyr.
//!
//! serde-saphyr reads a manifest in two layers: granit-parser turns the text into events, and its
//! serde deserializer turns the events into a `Value` (recording each mapping's keys for the
//! duplicate check, keeping budgets, comments and spans on the way). On the 10k-Ingress scale
//! folder the second layer costs more CPU than the parse itself. [`documents`] runs the same parser with the
//! same options and builds the `Value`s itself, but only for a subset where its result is by
//! construction the one serde-saphyr gives: mappings with string keys, sequences, quoted and
//! block scalars, and plain scalars whose type is certain (null and YAML 1.1 boolean spellings,
//! decimal integers without a leading zero, and text that cannot be a number). It answers `None`,
//! and the caller parses with serde-saphyr (whose result and diagnostics stay the reference), on
//! anything else: a parse error, a tag, an anchor or alias, a merge key, a duplicate or null key,
//! a float or other numeric spelling, a `%YAML` directive, a root that is not a mapping, or a file
//! at half of any of the budgets it is read with (`budget_for`).

use serde_json::{Map, Value};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, StrInput};

/// The documents of `text` as serde-saphyr's `from_multiple` would give them (null documents
/// skipped), or `None` when the text is outside the subset described in the module docs.
pub fn documents(text: &str) -> Option<Vec<Value>> {
    let budget = within_input_budget(text)?;
    let mut reader = Reader {
        events: Parser::with_options(StrInput::new(text), parser_options(&budget)),
        limits: Counts::half_of(&budget),
        counts: Counts::default(),
        depth: 0,
    };
    reader.stream()
}

/// The budget a manifest file of `text` is read with: serde-saphyr's default, its counts of
/// events, nodes, scalar bytes and documents raised to what a text of that size can hold without
/// aliases (each needs at least a byte of its own; alias and anchor limits stay the defaults, so
/// expansion stays bounded). The defaults (250,000 nodes, 1,024 documents) refused the plain
/// files users export with `kubectl get -o yaml`: a `List` of 20,000 EndpointSlices has millions
/// of nodes, and the folder is the operator's own.
pub fn budget_for(text: &str) -> serde_saphyr::Budget {
    let mut budget = serde_saphyr::Budget::default();
    let len = text.len();
    budget.max_events = budget.max_events.max(len.saturating_mul(4));
    budget.max_nodes = budget.max_nodes.max(len.saturating_mul(4));
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len.saturating_mul(2));
    budget.max_documents = budget.max_documents.max(len);
    budget
}

/// [`budget_for`] `text`, when `text` is under half of its input limit.
pub(super) fn within_input_budget(text: &str) -> Option<serde_saphyr::Budget> {
    let budget = budget_for(text);
    let over = budget
        .max_reader_input_bytes
        .is_some_and(|max| text.len() > max / 2);
    (!over).then_some(budget)
}

/// The parser options serde-saphyr derives from its default budget (`Budget::parser_options`):
/// the same text is accepted or refused by the same parser.
fn parser_options(budget: &serde_saphyr::Budget) -> serde_saphyr::granit_parser::Options {
    let mut options = serde_saphyr::granit_parser::Options::default();
    options.simple_key_max_lookahead = budget.simple_key_max_lookahead;
    options.flow_nesting_limit = budget.flow_nesting_limit;
    options.block_nesting_limit = options
        .block_nesting_limit
        .max(budget.max_depth.saturating_add(1));
    options.emit_comments = true;
    options.max_buffered_comment_events = budget.max_buffered_comment_events;
    options
}

/// What serde-saphyr's budget counts, kept here to stay far below its limits.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) events: usize,
    pub(super) nodes: usize,
    pub(super) scalar_bytes: usize,
    pub(super) comment_bytes: usize,
    pub(super) documents: usize,
    pub(super) depth: usize,
}

impl Counts {
    /// Half of each limit: a text this fast path accepts is never near a budget breach.
    pub(super) fn half_of(budget: &serde_saphyr::Budget) -> Counts {
        Counts {
            events: budget.max_events / 2,
            nodes: budget.max_nodes / 2,
            scalar_bytes: budget.max_total_scalar_bytes / 2,
            comment_bytes: budget.max_total_comment_bytes / 2,
            documents: budget.max_documents / 2,
            depth: budget.max_depth / 2,
        }
    }

    pub(super) fn within(&self, limits: &Counts) -> bool {
        self.events <= limits.events
            && self.nodes <= limits.nodes
            && self.scalar_bytes <= limits.scalar_bytes
            && self.comment_bytes <= limits.comment_bytes
            && self.documents <= limits.documents
            && self.depth <= limits.depth
    }
}

struct Reader<'t> {
    events: Parser<'t, StrInput<'t>>,
    limits: Counts,
    counts: Counts,
    depth: usize,
}

impl<'t> Reader<'t> {
    /// The next event other than a comment, counted; `None` on a parse error, the end of the
    /// events, or counts beyond the limits.
    fn next(&mut self) -> Option<Event<'t>> {
        loop {
            let (event, _span) = self.events.next_event()?.ok()?;
            self.counts.events += 1;
            match &event {
                Event::Comment(text, _) => self.counts.comment_bytes += text.len(),
                Event::Scalar(value, ..) => {
                    self.counts.nodes += 1;
                    self.counts.scalar_bytes += value.len();
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => self.counts.nodes += 1,
                Event::DocumentStart(..) => self.counts.documents += 1,
                _ => {}
            }
            self.counts.depth = self.counts.depth.max(self.depth);
            if !self.counts.within(&self.limits) {
                return None;
            }
            if !matches!(event, Event::Comment(..)) {
                return Some(event);
            }
        }
    }

    /// Every document of the stream; null documents are skipped as `from_multiple` skips them.
    fn stream(&mut self) -> Option<Vec<Value>> {
        let Event::StreamStart = self.next()? else {
            return None;
        };
        let mut documents = Vec::new();
        loop {
            match self.next()? {
                Event::StreamEnd => return Some(documents),
                Event::DocumentStart(_, None) => {}
                _ => return None,
            }
            match self.next()? {
                Event::MappingStart(_, 0, None) => documents.push(self.mapping()?),
                Event::Scalar(value, ScalarStyle::Plain, 0, None) if is_null(&value) => {}
                _ => return None,
            }
            let Event::DocumentEnd = self.next()? else {
                return None;
            };
        }
    }

    /// The node that starts with `event`.
    fn node(&mut self, event: Event<'t>) -> Option<Value> {
        match event {
            Event::Scalar(value, ScalarStyle::Plain, 0, None) => plain(&value),
            Event::Scalar(value, _, 0, None) => Some(Value::String(value.into_owned())),
            Event::MappingStart(_, 0, None) => self.mapping(),
            Event::SequenceStart(_, 0, None) => self.sequence(),
            _ => None,
        }
    }

    /// A mapping's entries, its start already read.
    fn mapping(&mut self) -> Option<Value> {
        self.depth += 1;
        let mut map = Map::new();
        loop {
            let key = match self.next()? {
                Event::MappingEnd => break,
                Event::Scalar(key, style, 0, None) => key_text(key, style)?,
                _ => return None,
            };
            let first = self.next()?;
            let value = self.node(first)?;
            if map.insert(key, value).is_some() {
                return None;
            }
        }
        self.depth -= 1;
        Some(Value::Object(map))
    }

    /// A sequence's items, its start already read.
    fn sequence(&mut self) -> Option<Value> {
        self.depth += 1;
        let mut items = Vec::new();
        loop {
            match self.next()? {
                Event::SequenceEnd => break,
                first => items.push(self.node(first)?),
            }
        }
        self.depth -= 1;
        Some(Value::Array(items))
    }
}

/// A mapping key as serde-saphyr gives `Value` one (the scalar's text); `None` for a null key
/// (an error there) and for `<<` (a merge key).
pub(super) fn key_text(key: std::borrow::Cow<'_, str>, style: ScalarStyle) -> Option<String> {
    if key == "<<" || (style == ScalarStyle::Plain && is_null(&key)) {
        return None;
    }
    Some(key.into_owned())
}

/// Plain-scalar spellings of null.
fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// An untagged plain scalar's value, when its type is certain; `None` otherwise.
pub(super) fn plain(text: &str) -> Option<Value> {
    if is_null(text) {
        return Some(Value::Null);
    }
    if let Some(b) = yaml11_bool(text) {
        return Some(Value::Bool(b));
    }
    let bytes = text.as_bytes();
    let numeral_start = matches!(bytes[0], b'0'..=b'9' | b'+' | b'-' | b'.');
    if !numeral_start {
        return Some(Value::String(text.to_owned()));
    }
    if bytes.iter().all(u8::is_ascii_digit) && (bytes[0] != b'0' || bytes.len() == 1) {
        return text.parse::<u64>().ok().map(|n| Value::Number(n.into()));
    }
    if cannot_be_a_number(bytes) {
        return Some(Value::String(text.to_owned()));
    }
    None
}

/// serde-saphyr's booleans for untyped values (`strict_booleans` off): YAML 1.1 spellings.
fn yaml11_bool(text: &str) -> Option<bool> {
    let is = |word: &str| text.eq_ignore_ascii_case(word);
    if is("true") || is("yes") || is("y") || is("on") {
        Some(true)
    } else if is("false") || is("no") || is("n") || is("off") {
        Some(false)
    } else {
        None
    }
}

/// Whether no numeric spelling (integer in any radix, with `_` separators; float, `.inf`, `.nan`)
/// can be this text. After an optional sign each of them starts with a digit or a `.`, has at
/// most one `.`, uses only the bytes of [`NUMERIC`], and has no further sign but an exponent's.
fn cannot_be_a_number(bytes: &[u8]) -> bool {
    let unsigned = match bytes {
        [b'+' | b'-', rest @ ..] => rest,
        _ => bytes,
    };
    !matches!(unsigned.first(), Some(b'0'..=b'9' | b'.'))
        || unsigned.iter().any(|b| !NUMERIC.contains(b))
        || unsigned.iter().filter(|&&b| b == b'.').count() > 1
        || (1..unsigned.len())
            .any(|i| matches!(unsigned[i], b'+' | b'-') && !matches!(unsigned[i - 1], b'e' | b'E'))
}

/// Every byte of a numeric spelling serde-saphyr reads (digits, hex digits, radix prefixes,
/// separators, signs, `.`, exponents, and the letters of `inf`, `infinity` and `nan`).
const NUMERIC: &[u8] = b"0123456789abcdefABCDEF_+-.xXoObBiInNtTyY";

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// serde-saphyr's reading of `text`, as `files::parse` asks for it.
    pub(in crate::source) fn reference(text: &str) -> Option<Vec<Value>> {
        let options = serde_saphyr::options! {
            with_snippet: false,
            budget: Some(budget_for(text)),
        };
        serde_saphyr::from_multiple_with_options(text, options).ok()
    }

    /// Whether the fast path read `text`; when it did, its documents must be serde-saphyr's.
    fn read_as_reference(text: &str) -> bool {
        match documents(text) {
            Some(fast) => {
                assert_eq!(Some(fast), reference(text), "read differently: {text:?}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn every_manifest_in_the_repository_reads_as_serde_saphyr_reads_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in [
            "controller/tests",
            "examples",
            "charts",
            "conformance",
            "benches",
        ] {
            collect_yaml(&root.join(dir), &mut files);
        }
        assert!(files.len() > 100, "only {} manifests found", files.len());
        let mut fast = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            if read_as_reference(&text) {
                fast += 1;
            }
        }
        // Helm templates and deliberately broken files are left to serde-saphyr; the rest of the
        // repository's manifests are read by the fast path.
        assert!(
            fast * 10 > files.len() * 8,
            "{fast} of {} read fast",
            files.len()
        );
    }

    /// The `*.yaml` and `*.yml` files under `dir`, into `files`.
    pub(in crate::source) fn collect_yaml(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                collect_yaml(&path, files);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }

    /// Plain scalars whose type serde-saphyr decides by their spelling, in a value, a key, a
    /// block and a flow sequence.
    const SPELLINGS: &[&str] = &[
        "web",
        "TCP",
        "http",
        "Prefix",
        "app-0-ipv4",
        "kubernetes.io/service-name",
        "/api/v1",
        "true",
        "True",
        "TRUE",
        "false",
        "yes",
        "Yes",
        "no",
        "NO",
        "on",
        "Off",
        "y",
        "Y",
        "n",
        "N",
        "null",
        "Null",
        "NULL",
        "~",
        "nul",
        "nulls",
        "0",
        "1",
        "80",
        "8080",
        "65535",
        "007",
        "00",
        "-1",
        "-0",
        "+1",
        "+80",
        "-80",
        "1_000",
        "0x1F",
        "0X1F",
        "0o17",
        "0O17",
        "0b101",
        "0B1",
        "1.5",
        "-1.5",
        ".5",
        "5.",
        "1e3",
        "1E3",
        "1e+3",
        "1e-3",
        "-1e3",
        ".inf",
        "-.inf",
        "+.inf",
        ".Inf",
        ".NaN",
        ".nan",
        "-.nan",
        "inf",
        "-inf",
        "infinity",
        "nan",
        "NaN",
        "1e999",
        "18446744073709551615",
        "18446744073709551616",
        "9223372036854775807",
        "-9223372036854775808",
        "-9223372036854775809",
        "10.0.0.1",
        "127.1.0.0",
        "0.1.0",
        "2001:db8::1",
        "::1",
        "fd00:5ca1:e::1",
        "[::1]:80",
        "10s",
        "1m30s",
        "512Mi",
        "1Gi",
        "100m",
        "50%",
        "2024-01-01",
        "2001-12-14t21:59:43.10-05:00",
        "12:30",
        "1:20:30",
        "-conf",
        "--flag",
        "-",
        "+",
        ".",
        "-.",
        "e",
        "E5",
        "x1",
        "0x",
        "0b",
        "1__0",
        "_1",
        "1_",
        "0e0",
        "00000000-0000-4000-8000-0000000003e8",
        "1-2",
        "1+2",
        "1.2.3",
        "v1.12.2",
        "a b",
        "1 2",
        "héllo",
        "日本",
        "a#b",
        "<<",
        "=",
        "${VAR}",
        "@",
        "%",
    ];

    #[test]
    fn plain_scalars_resolve_as_serde_saphyr_resolves_them() {
        for spelling in SPELLINGS {
            for text in [
                format!("k: {spelling}\n"),
                format!("{spelling}: v\n"),
                format!("k:\n  - {spelling}\n  - x\n"),
                format!("k: [{spelling}, x]\n"),
                format!("k: {{a: {spelling}}}\n"),
            ] {
                read_as_reference(&text);
            }
        }
        // Every short spelling over the bytes numbers are made of.
        let alphabet = [
            "0", "1", "9", ".", "-", "+", "e", "E", "x", "o", "b", "_", "a", "f", "i", "n", "y",
            ":", "N",
        ];
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    read_as_reference(&format!("k: {a}{b}{c}\n"));
                    read_as_reference(&format!("k: {a}{b}\n"));
                    read_as_reference(&format!("k: {a}\n"));
                }
            }
        }
    }

    #[test]
    fn what_manifests_are_made_of_takes_the_fast_path() {
        // Names, words, ports, booleans, both families' addresses (quoted or not), uids.
        for text in [
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns-0}\nspec:\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n",
            "addresses: [\"127.1.0.0\", 10.0.0.1, \"fd00:5ca1:e::1\", 2001:db8::1]\nconditions: {ready: true}\n",
            "targetRef: {kind: Pod, uid: 00000000-0000-4000-8000-0000000003e8}\n",
            "a: |\n  line\n  other\nb: >-\n  folded\n  text\nc: 'single ''q'''\nd: \"esc\\tape\\u00e9\"\n",
            "# comment\n---\napiVersion: v1\nkind: Secret # trailing\n---\n",
            "",
        ] {
            assert!(read_as_reference(text), "not read fast: {text:?}");
        }
    }

    #[test]
    fn odd_documents_read_as_serde_saphyr_reads_them_or_go_to_it() {
        let long_key = format!("{}: 1\n", "k".repeat(2000));
        let deep = format!("{}1{}\n", "[".repeat(40), "]".repeat(40));
        let deep_block = (0..40).fold(String::from("v"), |inner, n| {
            format!(
                "k{n}:\n{}",
                inner
                    .lines()
                    .map(|l| format!("  {l}\n"))
                    .collect::<String>()
            )
        });
        let many_docs = "a: 1\n---\n".repeat(600);
        for text in [
            "---\n",
            "---\n...\n",
            "...\n",
            "# only a comment\n",
            "~\n",
            "null\n",
            "---\nnull\n---\na: 1\n",
            "- a\n- b\n",
            "just text\n",
            "42\n",
            "a: 1\na: 2\n",
            "a: 1\n\"a\": 2\n",
            "1: x\n\"1\": y\n",
            "? [a, b]\n: c\n",
            "? a\n: b\n",
            "a: &x 1\nb: *x\n",
            "base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n",
            "\"<<\": {x: 1}\n",
            "a: !!str 1\n",
            "a: !custom x\n",
            "!!map {a: 1}\n",
            "%YAML 1.2\n---\na: 1\n",
            "%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n",
            "\u{feff}a: 1\n",
            "a: 1\r\nb: two\r\n",
            "a:\tb\n",
            "a:\n\t- b\n",
            "a: [1, 2\n",
            "a: b: c\n",
            "a:\n  - b\n c: d\n",
            "a: 'unclosed\n",
            "a: \"bad \\q escape\"\n",
            "a: x\n  y\n  z\n",
            "a: |+\n  keep\n\n",
            "a: >\n  f\n\n  g\n",
            "a:\nb:\n",
            "a: {}\nb: []\n",
            "{a: 1, b: [x, {c: d}]}\n",
            "null: 1\n",
            "~: 1\n",
            ": 1\n",
            "\"null\": 1\n",
            "'~': 1\n",
            "'': 1\n",
            "a: - b\n",
            "- - a\n  - b\n",
            "a: 1 # c\n# c\nb: 2\n",
            "a: @x\n",
            "a: `x\n",
            &long_key,
            &deep,
            &deep_block,
            &many_docs,
        ] {
            read_as_reference(text);
        }
    }
}
