//! Manifest YAML read straight from its bytes, for the plainest layout manifests have: block
//! mappings and sequences indented with spaces, flow collections closed on their line, single-line
//! quoted scalars without escapes, plain scalars on one line. [`documents`] gives the `Value`s
//! serde-saphyr gives (as [`super::yaml_fast::documents`] does) for any text it accepts, and
//! `None` for anything else, which `files::parse` then reads with the YAML parser: it never
//! guesses.
//!
//! On the 10k-Ingress scale folder the YAML parser's tokens and events (a queue of tokens moved
//! in memory for every one) are most of the start's CPU; this reader makes no token and no event, only
//! the `Value`s. What it accepts is deliberately narrow; it answers `None` on:
//! - any byte outside printable ASCII and `\n` (tabs, `\r`, a byte order mark, any non-ASCII text),
//! - `%` directives, `...` document ends, a `---` with anything else on its line, more than
//!   [`MAX_DOCUMENTS`] documents, a root that is not a block mapping at column 0,
//! - tags, anchors, aliases, explicit keys (`?`), block scalars (`|`, `>`), and any plain scalar
//!   that starts with an indicator (`-?:,[]{}#&*!|>'"%@` and the backquote), contains `: `,
//!   `[`, `]`, `{` or `}`, or ends with `:` (these are left to the parser),
//! - a plain scalar whose type is not certain (floats, other radixes: see `yaml_fast::plain`),
//! - a scalar continued on the next line (any line indented where no node may start),
//! - a key that is not a plain word of `[A-Za-z0-9_./-]` (not starting with `-`) or a quoted
//!   scalar, a key longer than [`MAX_KEY`], a null or `<<` key, a duplicate key,
//! - a backslash in a double-quoted scalar, a quoted scalar or flow collection not closed on its
//!   line, a comment inside a flow collection, an empty or trailing flow entry, a flow mapping
//!   entry without a value, a key inside a flow sequence,
//! - nesting deeper than [`MAX_DEPTH`], more than [`MAX_COMMENT_RUN`] comments in a row (the
//!   parser buffers comments between documents, up to a budget), counts beyond half of
//!   serde-saphyr's budgets (as `yaml_fast`).

use serde_json::{Map, Value};

use super::yaml_fast::{key_text, plain, within_input_budget, Counts};

/// Nesting of collections accepted (serde-saphyr's default `max_depth` is 64).
const MAX_DEPTH: usize = 16;
/// The longest key accepted (the parser refuses a block key over 1,024 bytes).
const MAX_KEY: usize = 256;
/// Documents accepted in one text (serde-saphyr's default budget is 1,024).
const MAX_DOCUMENTS: usize = 256;
/// Comments in a row accepted (the parser's default buffer of comment events is 32).
const MAX_COMMENT_RUN: usize = 16;

/// The documents of `text` as serde-saphyr (and `yaml_fast::documents`) reads them (null
/// documents skipped), or `None` when the text is outside the layout described in the module
/// docs.
pub fn documents(text: &str) -> Option<Vec<Value>> {
    let budget = within_input_budget(text)?;
    let bytes = text.as_bytes();
    if bytes
        .iter()
        .any(|&b| !(b == b'\n' || (b' '..=b'~').contains(&b)))
    {
        return None;
    }
    let mut documents = Vec::new();
    let mut counts = Counts::default();
    let mut comment_run = 0;
    // The content lines of the document being read.
    let mut lines: Vec<Line> = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        let end = memchr_newline(bytes, start);
        let line = &bytes[start..end];
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        if line.starts_with(b"---") || line.starts_with(b"...") || line.starts_with(b"%") {
            if line != b"---" {
                return None;
            }
            comment_run = 0;
            if !lines.is_empty() {
                documents.push(document(bytes, &lines, &mut counts)?);
                lines.clear();
            }
            counts.documents += 1;
        } else if indent == line.len() {
            // Blank.
        } else if line[indent] == b'#' {
            comment_run += 1;
            counts.events += 1;
            counts.comment_bytes += line.len() - indent - 1;
            if comment_run > MAX_COMMENT_RUN {
                return None;
            }
        } else {
            comment_run = 0;
            lines.push(Line { start, indent, end });
        }
        start = end + 1;
    }
    if !lines.is_empty() {
        documents.push(document(bytes, &lines, &mut counts)?);
    }
    counts.documents += 1;
    if counts.documents > MAX_DOCUMENTS {
        return None;
    }
    // Every node is one event (a scalar) or two (a collection's start and end); each document two
    // more, the stream two; each comment one (counted as read).
    counts.events += 2 * counts.nodes + 2 * counts.documents + 2;
    counts
        .within(&Counts::half_of(&budget))
        .then_some(documents)
}

/// The offset of the next `\n` from `from`, or the text's length.
fn memchr_newline(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |n| from + n)
}

/// A line with content: its offsets in the text (`end` at its `\n`) and its indentation.
#[derive(Clone, Copy)]
struct Line {
    start: usize,
    indent: usize,
    end: usize,
}

/// One document's root mapping.
fn document(bytes: &[u8], lines: &[Line], counts: &mut Counts) -> Option<Value> {
    if lines[0].indent != 0 {
        return None;
    }
    let mut reader = Reader {
        bytes,
        lines,
        line: 0,
        counts,
        depth: 0,
    };
    let root = reader.mapping(0, 0)?;
    (reader.line == lines.len()).then_some(root)
}

struct Reader<'t, 'c> {
    bytes: &'t [u8],
    lines: &'t [Line],
    /// The line being read.
    line: usize,
    counts: &'c mut Counts,
    depth: usize,
}

impl<'t> Reader<'t, '_> {
    /// The current line's text from column `column`, without its `\n`.
    fn rest(&self, column: usize) -> &'t [u8] {
        let line = self.lines[self.line];
        &self.bytes[line.start + column..line.end]
    }

    /// The indentation of the current line, `None` past the last.
    fn indent(&self) -> Option<usize> {
        self.lines.get(self.line).map(|l| l.indent)
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        self.counts.nodes += 1;
        self.counts.depth = self.counts.depth.max(self.depth);
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// A block mapping whose keys are at `indent`; its first key at column `column` of the
    /// current line (`indent` itself, or after a sequence entry's `- `).
    fn mapping(&mut self, indent: usize, column: usize) -> Option<Value> {
        self.enter()?;
        let mut map = Map::new();
        let mut column = column;
        loop {
            let text = self.rest(column);
            let (key, after) = block_key(text)?;
            self.counts.nodes += 1;
            self.counts.scalar_bytes += key.len();
            let value = self.value_after_key(indent, column + after)?;
            if map.insert(key, value).is_some() {
                return None;
            }
            match self.indent() {
                Some(next) if next == indent => {
                    column = indent;
                    if is_entry(self.rest(indent)) {
                        // A sequence entry at the mapping's indentation: only an indentless
                        // sequence (read by `value_after_key`) may be there.
                        return None;
                    }
                }
                Some(next) if next > indent => return None,
                _ => break,
            }
        }
        self.depth -= 1;
        Some(Value::Object(map))
    }

    /// The value of the key of a mapping at `indent` whose `:` ends before column `column`.
    fn value_after_key(&mut self, indent: usize, column: usize) -> Option<Value> {
        let text = self.rest(column);
        let skipped = text.iter().take_while(|&&b| b == b' ').count();
        if skipped < text.len() && (skipped == 0 || text[skipped] != b'#') {
            let value = self.inline(column + skipped)?;
            self.line += 1;
            return Some(value);
        }
        // Nothing (or a comment) after the key: the value is on the next lines, or null.
        self.comment(&text[skipped..]);
        self.line += 1;
        match self.indent() {
            Some(next) if next > indent => self.nested(next),
            Some(next) if next == indent && is_entry(self.rest(indent)) => self.sequence(indent),
            _ => {
                self.counts.nodes += 1;
                Some(Value::Null)
            }
        }
    }

    /// The block node starting the current line at `indent`.
    fn nested(&mut self, indent: usize) -> Option<Value> {
        if is_entry(self.rest(indent)) {
            self.sequence(indent)
        } else {
            self.mapping(indent, indent)
        }
    }

    /// A block sequence whose entries (`- `) are at `indent`, from the current line.
    fn sequence(&mut self, indent: usize) -> Option<Value> {
        self.enter()?;
        let mut items = Vec::new();
        while self.indent() == Some(indent) && is_entry(self.rest(indent)) {
            let text = self.rest(indent + 1);
            let skipped = text.iter().take_while(|&&b| b == b' ').count();
            let column = indent + 1 + skipped;
            if skipped == text.len() || text[skipped] == b'#' {
                // `-` alone (or with a comment): the item is on the next lines, or null.
                self.comment(&text[skipped..]);
                self.line += 1;
                match self.indent() {
                    Some(next) if next > indent => items.push(self.nested(next)?),
                    _ => {
                        self.counts.nodes += 1;
                        items.push(Value::Null);
                    }
                }
            } else if is_entry(&text[skipped..]) {
                // `- - x`: left to the parser.
                return None;
            } else if block_key(&text[skipped..]).is_some() {
                items.push(self.mapping(column, column)?);
            } else {
                items.push(self.inline(column)?);
                self.line += 1;
            }
            if self.indent().is_some_and(|next| next > indent) {
                return None;
            }
        }
        self.depth -= 1;
        Some(Value::Array(items))
    }

    /// A scalar or flow collection at `column` of the current line, ending the line (a comment
    /// may follow).
    fn inline(&mut self, column: usize) -> Option<Value> {
        let text = self.rest(column);
        let (value, used) = match text[0] {
            b'[' | b'{' => {
                let mut flow = Flow {
                    text,
                    at: 0,
                    reader: self,
                };
                let value = flow.node()?;
                (value, flow.at)
            }
            b'"' | b'\'' => {
                let (value, used) = quoted(text)?;
                self.scalar(&value);
                (Value::String(value), used)
            }
            _ => {
                let end = plain_end(text);
                let value = &text[..end];
                if !plain_ok(value, b"[]{}") || contains(value, b": ") || value.ends_with(b":") {
                    return None;
                }
                let value = std::str::from_utf8(value).ok()?;
                self.scalar(value);
                (plain(value)?, end)
            }
        };
        self.line_end(text, used).then_some(value)
    }

    /// Whether `text` from `at`, after a node, ends the line: spaces, then nothing or a comment
    /// (after at least one space).
    fn line_end(&mut self, text: &[u8], at: usize) -> bool {
        let skipped = text[at..].iter().take_while(|&&b| b == b' ').count();
        let end = at + skipped;
        if end == text.len() {
            return true;
        }
        if text[end] == b'#' && end > 0 && text[end - 1] == b' ' {
            self.comment(&text[end..]);
            return true;
        }
        false
    }

    /// Counts a comment (`#` and its text; nothing for an empty `text`).
    fn comment(&mut self, text: &[u8]) {
        if !text.is_empty() {
            self.counts.events += 1;
            self.counts.comment_bytes += text.len() - 1;
        }
    }

    fn scalar(&mut self, text: &str) {
        self.counts.nodes += 1;
        self.counts.scalar_bytes += text.len();
    }
}

/// A flow collection on one line.
struct Flow<'r, 't, 'c> {
    text: &'t [u8],
    at: usize,
    reader: &'r mut Reader<'t, 'c>,
}

impl Flow<'_, '_, '_> {
    fn spaces(&mut self) {
        while self.text.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// A node inside a flow collection (or the collection itself); after it, spaces skipped.
    fn node(&mut self) -> Option<Value> {
        let value = match self.peek()? {
            b'[' => self.sequence()?,
            b'{' => self.mapping()?,
            _ => {
                let (text, plain_style) = self.scalar()?;
                if plain_style {
                    plain(&text)?
                } else {
                    Value::String(text)
                }
            }
        };
        self.spaces();
        Some(value)
    }

    /// A scalar (plain or quoted) and whether it was plain; spaces after it skipped.
    fn scalar(&mut self) -> Option<(String, bool)> {
        let rest = &self.text[self.at..];
        let (text, used, plain_style) = match rest.first()? {
            b'"' | b'\'' => {
                let (text, used) = quoted(rest)?;
                (text, used, false)
            }
            _ => {
                let end = flow_plain_end(rest)?;
                let text = trim_end(&rest[..end]);
                if !plain_ok(text, b"") {
                    return None;
                }
                (std::str::from_utf8(text).ok()?.to_owned(), end, true)
            }
        };
        self.at += used;
        self.reader.scalar(&text);
        self.spaces();
        Some((text, plain_style))
    }

    fn sequence(&mut self) -> Option<Value> {
        self.reader.enter()?;
        self.at += 1;
        self.spaces();
        let mut items = Vec::new();
        if self.peek()? != b']' {
            loop {
                items.push(self.node()?);
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        self.spaces();
                        if matches!(self.peek()?, b']' | b',') {
                            return None;
                        }
                    }
                    b']' => break,
                    // `:` (a key in a sequence) or anything else.
                    _ => return None,
                }
            }
        }
        self.at += 1;
        self.reader.depth -= 1;
        Some(Value::Array(items))
    }

    fn mapping(&mut self) -> Option<Value> {
        self.reader.enter()?;
        self.at += 1;
        self.spaces();
        let mut map = Map::new();
        if self.peek()? != b'}' {
            loop {
                if matches!(self.peek()?, b'[' | b'{') {
                    return None;
                }
                let (key, plain_style) = self.scalar()?;
                if key.len() > MAX_KEY {
                    return None;
                }
                let key = key_text(key.into(), style(plain_style))?;
                // `: ` and a value.
                if self.peek()? != b':' || self.text.get(self.at + 1) != Some(&b' ') {
                    return None;
                }
                self.at += 1;
                self.spaces();
                if matches!(self.peek()?, b',' | b'}') {
                    return None;
                }
                let value = self.node()?;
                if map.insert(key, value).is_some() {
                    return None;
                }
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        self.spaces();
                        if matches!(self.peek()?, b'}' | b',') {
                            return None;
                        }
                    }
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        self.at += 1;
        self.reader.depth -= 1;
        Some(Value::Object(map))
    }
}

fn style(plain_style: bool) -> serde_saphyr::granit_parser::ScalarStyle {
    use serde_saphyr::granit_parser::ScalarStyle;
    if plain_style {
        ScalarStyle::Plain
    } else {
        ScalarStyle::DoubleQuoted
    }
}

/// Whether a line's text (from its indentation) is a block sequence entry: `-` then a space or
/// the line's end.
fn is_entry(text: &[u8]) -> bool {
    text.first() == Some(&b'-') && matches!(text.get(1), None | Some(b' '))
}

/// A block mapping key at the start of `text` and the offset just past its `:` (which a space or
/// the line's end follows); `None` when `text` does not start with one.
fn block_key(text: &[u8]) -> Option<(String, usize)> {
    let (key, plain_style, used) = match text.first()? {
        b'"' | b'\'' => {
            let (key, used) = quoted(text)?;
            (key, false, used)
        }
        b'-' => return None,
        _ => {
            let used = text.iter().take_while(|&&b| is_word(b)).count();
            let key = std::str::from_utf8(&text[..used]).ok()?.to_owned();
            (key, true, used)
        }
    };
    if key.is_empty() && plain_style || key.len() > MAX_KEY {
        return None;
    }
    if text.get(used) != Some(&b':') || !matches!(text.get(used + 1), None | Some(b' ')) {
        return None;
    }
    let key = key_text(key.into(), style(plain_style))?;
    Some((key, used + 1))
}

/// The bytes of a plain key: `[A-Za-z0-9_./-]`.
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')
}

/// A quoted scalar at the start of `text`, closed on the line, and the bytes it took; `None` for
/// a backslash in a double-quoted one.
fn quoted(text: &[u8]) -> Option<(String, usize)> {
    let quote = text[0];
    let mut value = Vec::new();
    let mut at = 1;
    loop {
        let b = *text.get(at)?;
        if b == quote {
            if quote == b'\'' && text.get(at + 1) == Some(&b'\'') {
                value.push(b'\'');
                at += 2;
                continue;
            }
            break;
        }
        if b == b'\\' && quote == b'"' {
            return None;
        }
        value.push(b);
        at += 1;
    }
    Some((String::from_utf8(value).ok()?, at + 1))
}

/// Where a plain scalar in block context ends: before ` #` or the line's end, trailing spaces
/// dropped.
fn plain_end(text: &[u8]) -> usize {
    let mut end = text.len();
    for i in 1..text.len() {
        if text[i] == b'#' && text[i - 1] == b' ' {
            end = i;
            break;
        }
    }
    trim_end(&text[..end]).len()
}

/// Where a plain scalar in a flow collection ends: at `,`, a bracket or brace, or a `:` followed
/// by a space or one of those; `None` when a comment or the line's end comes first.
fn flow_plain_end(text: &[u8]) -> Option<usize> {
    for i in 0..text.len() {
        match text[i] {
            b',' | b'[' | b']' | b'{' | b'}' => return Some(i),
            b':' if matches!(
                text.get(i + 1),
                None | Some(b' ' | b',' | b'[' | b']' | b'{' | b'}')
            ) =>
            {
                return Some(i)
            }
            b'#' if i > 0 && text[i - 1] == b' ' => return None,
            _ => {}
        }
    }
    None
}

fn trim_end(text: &[u8]) -> &[u8] {
    let kept = text.len() - text.iter().rev().take_while(|&&b| b == b' ').count();
    &text[..kept]
}

/// Whether a plain scalar's text is one this reader takes: not empty, not starting with an
/// indicator, without any of `banned`.
fn plain_ok(text: &[u8], banned: &[u8]) -> bool {
    const INDICATORS: &[u8] = b"-?:,[]{}#&*!|>'\"%@`";
    match text.first() {
        None => false,
        Some(first) => !INDICATORS.contains(first) && !text.iter().any(|b| banned.contains(b)),
    }
}

fn contains(text: &[u8], needle: &[u8]) -> bool {
    text.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::super::yaml_fast::tests::{collect_yaml, reference};
    use super::*;
    use std::path::Path;

    /// Whether this reader took `text`; when it did, its documents must be serde-saphyr's.
    fn read_as_reference(text: &str) -> bool {
        match documents(text) {
            Some(lite) => {
                assert_eq!(Some(lite), reference(text), "read differently: {text:?}");
                true
            }
            None => false,
        }
    }

    /// The four files of `benches/load/gen-scale.py`'s 10k-Ingress scale folder, as it writes them.
    const SCALE: &[&str] = &[
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: duet}\nspec: {controller: duet.dev/ingress-controller}\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: app-0-ipv4\n  namespace: ns-0\n  labels: {kubernetes.io/service-name: app-0}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n  - addresses: [\"127.1.0.0\"]\n    conditions: {ready: true}\n    targetRef: {kind: Pod, namespace: ns-0, name: app-0-0, uid: 00000000-0000-4000-8000-000000000000}\n  - addresses: [\"127.1.0.1\"]\n    conditions: {ready: true}\n    targetRef: {kind: Pod, namespace: ns-0, name: app-0-1, uid: 00000000-0000-4000-8000-000000000001}\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: app-0-ipv6\n  namespace: ns-0\n  labels: {kubernetes.io/service-name: app-0}\naddressType: IPv6\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n  - addresses: [\"fd00:5ca1:e::\"]\n    conditions: {ready: true}\n    targetRef: {kind: Pod, namespace: ns-0, name: app-0-0, uid: 00000000-0000-4000-8000-000000000000}\n  - addresses: [2001:db8::1]\n    conditions: {ready: false, serving: true}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: app-9977, namespace: ns-17}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  ports: [{name: http, port: 80, targetPort: http}]\n",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: app-0, namespace: ns-0}\nspec:\n  ingressClassName: duet\n  rules:\n    - host: app-0.scale.example\n      http:\n        paths:\n          - {path: /api, pathType: Prefix, backend: {service: {name: app-0, port: {name: http}}}}\n          - {path: /static/index.html, pathType: Exact, backend: {service: {name: app-0, port: {name: http}}}}\n",
    ];

    #[test]
    fn the_issue_13_folder_is_read_without_the_parser() {
        for text in SCALE {
            assert!(read_as_reference(text), "left to the parser: {text}");
        }
    }

    /// Block layouts, indentless sequences, comments, quoting and documents, as people write them.
    const LAYOUTS: &[&str] = &[
        "a: 1\nb:\n  c: x\n  d:\n  - 1\n  - 2\n  e: y\n",
        "a:\n- x\n- y: 1\n  z: 2\n-\n- - q\nb: 2\n",
        "a:\n  - x\n  -\n    k: v\n  - y: 1\n    w:\n      - 3\n",
        "# head\n---\n# doc\na: 'it''s' # c\nb: \"q\"   # d\nc: x#y\nd: x #y\n---\n---\ne: f\n",
        "a: # comment\n  b: 1\nc:   # c\nd: ~\n",
        "a: x\n  y\n",
        "a: x\n  # c\nb: y\n",
        "a: x\n# c\nb: y\n",
        "a:\n  b: 1\n c: 2\n",
        "a:\n    b: 1\n  c: 2\n",
        "- a\n- b\n",
        "  a: 1\n  b: 2\n",
        "a: b: c\n",
        "a: [b: c]\n",
        "a: {b, c: d}\n",
        "a: {b: }\n",
        "a: [x, ]\n",
        "a: [x,, y]\n",
        "a: [ ]\nb: { }\nc: [[], {}]\n",
        "a: [ x , y ]\nb: {c: d , e: f}\n",
        "a: {\"b\": c, 'd': e}\n",
        "a: {\"b\":c}\n",
        "a: {b:c}\n",
        "a: [b:c, ::1, fd00::]\n",
        "a: [http://x, 'y']\n",
        "a: [x] #c\nb: {y: z}#c\n",
        "a: [x\n  , y]\n",
        "a: 'x\n  y'\n",
        "a: \"x\\ty\"\n",
        "a: x]\n",
        "a: x, y\n",
        "a: -1\nb: - x\n",
        "a: ? x\n",
        "? a\n: b\n",
        "a: &x 1\n",
        "a: !!str 1\n",
        "a: |\n  x\n",
        "a: >\n  x\n",
        "a: %x\n",
        "a: @x\n",
        "a:\n- x\n  - y\n",
        "a:\n  - x\n - y\n",
        "a: 1\na: 2\n",
        "a: 1\n'a': 2\n",
        "null: 1\n",
        "~: 1\n",
        "'null': 1\n",
        "'': 1\n",
        "\"\": 1\n",
        "<<: {a: 1}\n",
        "a: {<<: x}\n",
        "a: {~: x}\n",
        "1: x\n",
        "true: x\nyes: y\n",
        "a.b/c-d_e: 1\n",
        "a b: 1\n",
        "a :1\n",
        "a:\n",
        "a:\nb:\n",
        "---\n",
        "--- \na: 1\n",
        "--- # c\na: 1\n",
        "---\n...\n",
        "%YAML 1.2\n---\na: 1\n",
        "",
        "\n\n",
        "# only\n",
        "a: 1\n---\nb: 2\n",
        "a: 1\n--- x\n",
        "a: 1\n---x: 2\n",
        "a: 1",
        "a:\n  - b",
        "a: 1\r\nb: 2\r\n",
        "a:\tb\n",
        "\u{feff}a: 1\n",
        "a: é\n",
        "a: [1, 2, 3]\nb: [yes, no, on, off, ~, null, 0x1F, 1.5, 007, 1e3, .inf]\n",
        "a: {b: {c: {d: [[[1]]]}}}\n",
        "- x\n",
        "a:\n  - b: 1\n    c:\n    - d\n    e: 2\n",
        "a:\n  -   b: 1\n      c: 2\n",
        "a:\n  - b: 1\n     c: 2\n",
    ];

    #[test]
    fn layouts_read_as_serde_saphyr_reads_them_or_go_to_the_parser() {
        let mut taken = 0;
        for text in LAYOUTS {
            if read_as_reference(text) {
                taken += 1;
            }
        }
        assert!(taken > 20, "only {taken} taken");
    }

    #[test]
    fn every_manifest_in_the_repository_reads_as_serde_saphyr_reads_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["controller", "examples", "charts", "conformance", "benches"] {
            collect_yaml(&root.join(dir), &mut files);
        }
        assert!(files.len() > 100, "only {} manifests found", files.len());
        let mut taken = 0;
        for file in &files {
            if read_as_reference(&std::fs::read_to_string(file).unwrap()) {
                taken += 1;
            }
        }
        // Most of the repository's manifests are in the plain layout.
        assert!(taken * 2 > files.len(), "{taken} of {} taken", files.len());
    }

    /// Texts one to three edits away (a byte removed, doubled, or replaced or followed by one of
    /// YAML's structural bytes) from the layouts above and the 10k-Ingress scale files: whatever
    /// this reader takes, serde-saphyr reads the same way.
    #[test]
    fn edits_read_as_serde_saphyr_reads_them_or_go_to_the_parser() {
        const BYTES: &[u8] = b" \n-:#,[]{}\"'a1.~?&!|>";
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        let bases: Vec<&str> = SCALE.iter().chain(LAYOUTS).copied().collect();
        let (mut taken, mut tried) = (0, 0);
        for _ in 0..20_000 {
            let mut text = bases[next(bases.len())].as_bytes().to_vec();
            for _ in 0..1 + next(3) {
                if text.is_empty() {
                    break;
                }
                let at = next(text.len());
                match next(4) {
                    0 => {
                        text.remove(at);
                    }
                    1 => text.insert(at, text[at]),
                    2 => text[at] = BYTES[next(BYTES.len())],
                    _ => text.insert(at, BYTES[next(BYTES.len())]),
                }
            }
            let Ok(text) = String::from_utf8(text) else {
                continue;
            };
            tried += 1;
            if read_as_reference(&text) {
                taken += 1;
            }
        }
        // Enough of them are taken for the comparison to mean something.
        assert!(taken * 10 > tried, "{taken} of {tried} taken");
    }
}
