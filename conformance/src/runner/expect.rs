//! How many scenarios each known feature folder holds (after Scenario Outlines expand), so that a
//! feature file that loses scenarios, or a folder that loses a file, fails the run instead of
//! running less.

use std::path::Path;

use anyhow::{bail, Context as _};

use super::parse;

/// A feature folder the runner knows, by the end of its path, and its files' scenario counts.
#[derive(Debug)]
pub struct KnownFolder {
    /// The last components of the folder's path.
    pub tail: &'static str,
    /// Each `.feature` file of the folder and its number of scenarios.
    pub files: &'static [(&'static str, usize)],
}

/// The folders `.ci/run` runs: the upstream Ingress conformance features (5 files, 30
/// scenarios) and duet's own (5 files, 8 scenarios). A change to a feature file that adds or
/// removes scenarios updates its count here.
pub const KNOWN: &[KnownFolder] = &[
    KnownFolder {
        tail: "upstream-ingress/features",
        files: &[
            ("default_backend.feature", 6),
            ("host_rules.feature", 6),
            ("ingress_class.feature", 1),
            ("load_balancing.feature", 1),
            ("path_rules.feature", 16),
        ],
    },
    KnownFolder {
        tail: "conformance/features",
        files: &[
            ("dual_stack.feature", 3),
            ("family_balance.feature", 1),
            ("family_fallback.feature", 2),
            ("ipv6_only_service.feature", 1),
            ("require_same_family.feature", 1),
        ],
    },
];

/// Counts the scenarios at `path` (a `.feature` file or a folder of them) and, when the folder
/// is a known one, checks that it holds exactly the known files with their known counts.
/// Returns the number of scenarios.
pub fn check(path: &Path) -> anyhow::Result<usize> {
    let files = parse::feature_files(path)
        .with_context(|| format!("cannot read features at {}", path.display()))?;
    let folder = if path.is_dir() {
        path.to_owned()
    } else {
        path.parent().unwrap_or(Path::new(".")).to_owned()
    };
    let folder = folder.canonicalize().unwrap_or(folder);
    let known = KNOWN.iter().find(|k| folder.ends_with(k.tail));
    let mut total = 0;
    for file in &files {
        let found = parse::scenario_count(file)?;
        total += found;
        let Some(known) = known else { continue };
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        match known.files.iter().find(|(n, _)| *n == name) {
            Some((_, want)) if *want != found => bail!(
                "{} has {found} scenarios, {want} expected (runner::expect::KNOWN)",
                file.display()
            ),
            Some(_) => {}
            None => bail!(
                "{} has no expected scenario count: add it to runner::expect::KNOWN",
                file.display()
            ),
        }
    }
    if let (Some(known), true) = (known, path.is_dir()) {
        for (name, _) in known.files {
            if !files.iter().any(|f| f.ends_with(name)) {
                bail!("{} is missing from {}", name, path.display());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn ours() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("features")
    }

    /// A copy of duet's feature folder under a temporary `…/conformance/features`.
    fn copy_of_ours() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("conformance/features");
        std::fs::create_dir_all(&to).unwrap();
        for file in parse::feature_files(&ours()).unwrap() {
            std::fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
        }
        (dir, to)
    }

    #[test]
    fn the_known_folders_hold_their_scenarios() {
        assert_eq!(check(&ours()).unwrap(), 8);
        assert_eq!(check(&ours().join("family_fallback.feature")).unwrap(), 2);
        let upstream = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/conformance/upstream-ingress/features");
        if upstream.exists() || std::env::var_os("CI").is_some() {
            assert_eq!(check(&upstream).unwrap(), 30);
        } else {
            eprintln!("SKIPPED: no upstream features at {}", upstream.display());
        }
    }

    #[test]
    fn a_lost_example_row_a_lost_file_or_an_unknown_file_fails() {
        let (_dir, copy) = copy_of_ours();
        assert_eq!(check(&copy).unwrap(), 8);
        // One Examples row fewer.
        let file = copy.join("family_fallback.feature");
        let text = std::fs::read_to_string(&file).unwrap();
        let row = "      | IPv6   | listen | closed | IPv4  |\n";
        assert!(text.contains(row));
        std::fs::write(&file, text.replace(row, "")).unwrap();
        let err = check(&copy).unwrap_err().to_string();
        assert!(err.contains("has 1 scenarios, 2 expected"), "{err}");
        std::fs::write(&file, text).unwrap();
        // A file gone.
        let gone = copy.join("dual_stack.feature");
        let text = std::fs::read_to_string(&gone).unwrap();
        std::fs::remove_file(&gone).unwrap();
        let err = check(&copy).unwrap_err().to_string();
        assert!(err.contains("dual_stack.feature is missing"), "{err}");
        std::fs::write(&gone, text.clone()).unwrap();
        // A file nobody declared.
        std::fs::write(copy.join("new.feature"), text).unwrap();
        let err = check(&copy).unwrap_err().to_string();
        assert!(err.contains("no expected scenario count"), "{err}");
    }

    #[test]
    fn unknown_folders_are_counted_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            ours().join("dual_stack.feature"),
            dir.path().join("a.feature"),
        )
        .unwrap();
        assert_eq!(check(dir.path()).unwrap(), 3);
    }
}
