//! Reads `.feature` files as the upstream Go runner (godog) does: a Scenario Outline expands to one
//! scenario per Examples row, and a `<name>` that is not a column stays literal (cucumber-rs
//! would reject it; the upstream `<key>`/`<value>` header tables rely on it).

use std::path::{Path, PathBuf};

use cucumber::gherkin::{self, GherkinEnv};
use cucumber::parser;
use futures_util::stream;

/// The parser: input is a `.feature` file or a folder of them (sorted by name).
#[derive(Clone, Copy, Debug, Default)]
pub struct GodogParser;

impl<I: AsRef<Path>> cucumber::Parser<I> for GodogParser {
    type Cli = cucumber::cli::Empty;
    type Output = stream::Iter<std::vec::IntoIter<parser::Result<gherkin::Feature>>>;

    fn parse(self, input: I, _cli: Self::Cli) -> Self::Output {
        stream::iter(parse_all(input.as_ref()))
    }
}

/// The `.feature` files at `path` (a file or a folder), sorted.
pub fn feature_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "feature"))
        .collect();
    files.sort();
    Ok(files)
}

fn parse_all(path: &Path) -> Vec<parser::Result<gherkin::Feature>> {
    let files = match feature_files(path) {
        Ok(files) => files,
        Err(e) => {
            return vec![Err(parser::Error::Parsing(std::sync::Arc::new(
                gherkin::ParseFileError::Reading {
                    path: path.to_owned(),
                    source: e,
                },
            )))]
        }
    };
    files
        .into_iter()
        .map(|file| {
            let feature = gherkin::Feature::parse_path(&file, GherkinEnv::default())?;
            Ok(expand(feature))
        })
        .collect()
}

/// How many scenarios a `.feature` file runs (outlines expanded, rules included).
pub fn scenario_count(file: &Path) -> Result<usize, gherkin::ParseFileError> {
    let feature = expand(gherkin::Feature::parse_path(file, GherkinEnv::default())?);
    Ok(feature.scenarios.len()
        + feature
            .rules
            .iter()
            .map(|r| r.scenarios.len())
            .sum::<usize>())
}

/// Expands every outline of a feature (also inside rules).
pub fn expand(mut feature: gherkin::Feature) -> gherkin::Feature {
    feature.scenarios = feature
        .scenarios
        .into_iter()
        .flat_map(expand_scenario)
        .collect();
    for rule in &mut feature.rules {
        rule.scenarios = std::mem::take(&mut rule.scenarios)
            .into_iter()
            .flat_map(expand_scenario)
            .collect();
    }
    feature
}

fn expand_scenario(scenario: gherkin::Scenario) -> Vec<gherkin::Scenario> {
    if scenario.examples.is_empty() {
        return vec![scenario];
    }
    let mut out = Vec::new();
    let mut id = 0;
    for example in &scenario.examples {
        let Some(table) = &example.table else {
            continue;
        };
        let Some((header, rows)) = table.rows.split_first() else {
            continue;
        };
        for row in rows {
            let subst = |text: &str| substitute(text, header, row);
            let mut s = scenario.clone();
            s.examples.clear();
            s.position = example.position;
            s.position.line += id + 2;
            id += 1;
            s.tags.extend(example.tags.iter().cloned());
            s.name = subst(&s.name);
            for step in &mut s.steps {
                step.value = subst(&step.value);
                if let Some(doc) = &mut step.docstring {
                    *doc = subst(doc);
                }
                if let Some(t) = &mut step.table {
                    for cell in t.rows.iter_mut().flatten() {
                        *cell = subst(cell);
                    }
                }
            }
            out.push(s);
        }
    }
    out
}

/// Replaces `<column>` by the row's value; unknown names stay as written.
pub fn substitute(text: &str, header: &[String], row: &[String]) -> String {
    let mut out = text.to_owned();
    for (name, value) in header.iter().zip(row) {
        out = out.replace(&format!("<{name}>"), value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_placeholders_stay_literal() {
        let header = vec!["method".to_owned(), "path".to_owned()];
        let row = vec!["GET".to_owned(), String::new()];
        assert_eq!(
            substitute("a \"<method>\" to \"<path>\" with <key>", &header, &row),
            "a \"GET\" to \"\" with <key>"
        );
    }
}
