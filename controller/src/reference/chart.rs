//! `chart-values.md` and the chart's `README.md`: every value of `values.yaml` with its type,
//! default and description, read as helm-docs reads them. A `# -- TEXT` comment (continued by
//! the `#` lines under it) describes the key on the next line; `# -- (TYPE) TEXT` overrides the
//! type; a described map is one row, its undescribed keys are not listed. Types and defaults come
//! from the parsed YAML.

use std::path::Path;

use serde_json::Value;

use super::{code, head, table};

/// One documented value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    key: String,
    kind: String,
    default: String,
    description: String,
}

/// The chart: its metadata and its values.
#[derive(Debug)]
pub(super) struct Chart {
    meta: Value,
    rows: Vec<Row>,
}

impl Chart {
    /// Reads `Chart.yaml` and `values.yaml` of the chart in `dir`.
    pub(super) fn read(dir: &Path) -> Result<Chart, String> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        let meta =
            serde_saphyr::from_str(&read("Chart.yaml")?).map_err(|e| format!("Chart.yaml: {e}"))?;
        let rows = values(&read("values.yaml")?)?;
        Ok(Chart { meta, rows })
    }

    fn field(&self, name: &str) -> &str {
        self.meta[name].as_str().unwrap_or_default()
    }

    fn values_table(&self) -> String {
        let rows = self.rows.iter().map(|r| {
            vec![
                code(&r.key),
                r.kind.clone(),
                code(&r.default),
                r.description.clone(),
            ]
        });
        table(&["Key", "Type", "Default", "Description"], rows)
    }

    /// `docs/src/reference/chart-values.md`.
    pub(super) fn page(&self) -> String {
        let mut out = head(
            "Chart values",
            &format!(
                "Every value of the `{}` Helm chart (version {}, duet {}), from the comments of \
                 `charts/duet/values.yaml`; `values.schema.json` checks them at install. Set them \
                 with `--set key=value` or `-f my-values.yaml`.",
                self.field("name"),
                self.field("version"),
                self.field("appVersion"),
            ),
        );
        out.push_str(&self.values_table());
        out
    }

    /// `charts/duet/README.md`, in helm-docs' layout.
    pub(super) fn readme(&self) -> String {
        let mut out = head(self.field("name"), self.field("description"));
        out.push_str(&format!(
            "Version: {} | App version: {} | Kubernetes: `{}`\n\nHome: <{}>\n\n\
             Install: `helm install duet charts/duet --namespace duet --create-namespace`\n\n\
             ## Values\n\n",
            self.field("version"),
            self.field("appVersion"),
            self.field("kubeVersion"),
            self.field("home"),
        ));
        out.push_str(&self.values_table());
        out
    }
}

/// A key line: its indentation, key and whether a value follows on the same line.
fn key_line(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start().len();
    let body = line.trim_start();
    if body.starts_with('#') || body.starts_with('-') {
        return None;
    }
    let (key, _) = body.split_once(':')?;
    Some((indent, key.trim().trim_matches('"')))
}

/// Every value of a `values.yaml`, in file order.
fn values(yaml: &str) -> Result<Vec<Row>, String> {
    let parsed: Value = serde_saphyr::from_str(yaml).map_err(|e| format!("values.yaml: {e}"))?;
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut comment: Option<String> = None;
    let mut described_above: Option<usize> = None;
    let mut rows = Vec::new();
    for line in yaml.lines() {
        let trimmed = line.trim();
        if let Some(text) = trimmed.strip_prefix("# --") {
            comment = Some(text.trim().to_owned());
            continue;
        }
        if let (Some(c), Some(text)) = (comment.as_mut(), trimmed.strip_prefix('#')) {
            c.push(' ');
            c.push_str(text.trim());
            continue;
        }
        let Some((indent, key)) = key_line(line) else {
            if trimmed.is_empty() {
                comment = None;
            }
            continue;
        };
        path.retain(|(i, _)| *i < indent);
        if described_above.is_some_and(|i| i >= indent) {
            described_above = None;
        }
        path.push((indent, key.to_owned()));
        let keys: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).collect();
        let value = keys.iter().fold(&parsed, |v, k| &v[*k]);
        let description = comment.take();
        let is_map = value.as_object().is_some_and(|m| !m.is_empty());
        if described_above.is_some() || (is_map && description.is_none()) {
            continue;
        }
        if is_map {
            described_above = Some(indent);
        }
        rows.push(row(&keys, value, description.unwrap_or_default()));
    }
    Ok(rows)
}

fn row(keys: &[&str], value: &Value, description: String) -> Row {
    let key: Vec<String> = keys
        .iter()
        .map(|k| {
            if k.contains(['.', '/']) {
                format!("\"{k}\"")
            } else {
                (*k).to_owned()
            }
        })
        .collect();
    let (kind, description) = match description.strip_prefix('(') {
        Some(typed) if typed.contains(')') => {
            let (kind, rest) = typed.split_once(')').unwrap_or_default();
            (kind.to_owned(), rest.trim().to_owned())
        }
        _ => (kind_of(value).to_owned(), description),
    };
    Row {
        key: key.join("."),
        kind,
        default: value.to_string(),
        description,
    }
}

/// helm-docs' name of a value's type.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "string",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_describe_the_next_key_and_described_maps_are_one_row() {
        let yaml = "# A file comment.\n\n# -- The name.\nname: \"\"\nimage:\n  # -- Where from,\n  # on two lines.\n  repository: r\n  pullPolicy: IfNotPresent\n# -- (int) Ports.\nports:\n  http: 80\nselector:\n  kubernetes.io/os: linux\nlist:\n  - a\n";
        let rows = values(yaml).unwrap();
        let got: Vec<(&str, &str, &str, &str)> = rows
            .iter()
            .map(|r| (&*r.key, &*r.kind, &*r.default, &*r.description))
            .collect();
        assert_eq!(
            got,
            [
                ("name", "string", "\"\"", "The name."),
                (
                    "image.repository",
                    "string",
                    "\"r\"",
                    "Where from, on two lines."
                ),
                ("image.pullPolicy", "string", "\"IfNotPresent\"", ""),
                ("ports", "int", "{\"http\":80}", "Ports."),
                ("selector.\"kubernetes.io/os\"", "string", "\"linux\"", ""),
                ("list", "list", "[\"a\"]", ""),
            ]
        );
    }
}
