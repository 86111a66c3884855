//! `duet migrate check`: reads Ingress manifests offline (as `kubectl get ingress -A -o yaml`
//! prints them, Lists and multi-document files included) and prints, per Ingress, every
//! `nginx.ingress.kubernetes.io/` annotation with what duet does with it, then a summary.

use std::collections::BTreeMap;
use std::io::{self, Read as _, Write};
use std::path::{Path, PathBuf};

use k8s_openapi::api::networking::v1::HTTPIngressPath;

use crate::stored::{Annotations, StoredIngress};

use crate::config::MigrateCheck;
use crate::index::Object;
use crate::source::files;
use crate::translate::nginx::routing::CanaryScope;
use crate::translate::nginx::{self, Finding, Status};

/// The legacy class annotation.
const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Why the input cannot be checked (exit 64).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A file or folder cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The path (`-` for standard input).
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A file is not valid YAML, or an Ingress in it does not decode.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file (`-` for standard input).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Writing the report failed.
    #[error("cannot write the report: {0}")]
    Write(#[source] io::Error),
}

/// One Ingress read from the input.
#[derive(Debug)]
struct Found {
    namespace: String,
    name: String,
    ingress: StoredIngress,
}

/// Runs the check, writing the report to `out`. `Ok(true)` when every annotation of every
/// checked Ingress is honoured.
pub fn check(args: &MigrateCheck, out: &mut dyn Write) -> Result<bool, MigrateError> {
    let mut found = Vec::new();
    for (path, text) in read_input(&args.input)? {
        found.extend(ingresses(&path, &text)?);
    }
    found.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let (checked, skipped): (Vec<Found>, Vec<Found>) = found.into_iter().partition(|f| {
        args.ingress_class
            .as_deref()
            .is_none_or(|c| class_of(&f.ingress) == Some(c))
    });
    let mut all: Vec<Finding> = Vec::new();
    let mut clean = 0;
    let reads: Vec<nginx::Read> = checked.iter().map(|f| read(f, args)).collect();
    let mains = mains(&checked, &reads);
    for (f, mut read) in checked.iter().zip(reads) {
        check_canary_scope(f, &mut read, &mains, args.canary_scope);
        print_ingress(out, f, &read.findings).map_err(MigrateError::Write)?;
        if read.findings.iter().all(|f| f.status.is_honoured()) {
            clean += 1;
        }
        all.extend(read.findings);
    }
    print_summary(out, args, checked.len(), skipped.len(), clean, &all)
        .map_err(MigrateError::Write)?;
    Ok(all.iter().all(|f| f.status.is_honoured()))
}

/// What duet makes of one Ingress's annotations on its own.
fn read(f: &Found, args: &MigrateCheck) -> nginx::Read {
    let empty = Annotations::default();
    let mut read = nginx::read(f.ingress.metadata.annotations.as_ref().unwrap_or(&empty));
    nginx::passthrough::settle(&mut read, args.enable_ssl_passthrough);
    nginx::access::settle_destination(&mut read);
    check_regex_paths(&f.ingress, &mut read);
    read
}

/// A host and path as an Ingress writes them (`""` for a rule without host).
type HostPath<'a> = (&'a str, &'a str);

/// Each path of an Ingress with its host.
fn paths(ingress: &StoredIngress) -> impl Iterator<Item = (&str, &HTTPIngressPath)> {
    let rules = ingress.spec.iter().flat_map(|s| s.rules.iter().flatten());
    rules.flat_map(|r| {
        let host = r.host.as_deref().unwrap_or("");
        r.http.iter().flat_map(|h| &h.paths).map(move |p| (host, p))
    })
}

/// A path as written (`/` when empty or unset).
fn written(path: &HTTPIngressPath) -> &str {
    path.path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or("/")
}

/// The host and path of each path of an Ingress.
fn host_paths(ingress: &StoredIngress) -> impl Iterator<Item = HostPath<'_>> {
    paths(ingress).map(|(host, path)| (host, written(path)))
}

/// The main (not canary) Ingresses of each host and path.
fn mains<'a>(
    checked: &'a [Found],
    reads: &[nginx::Read],
) -> BTreeMap<HostPath<'a>, Vec<&'a Found>> {
    let mut mains: BTreeMap<HostPath<'a>, Vec<&'a Found>> = BTreeMap::new();
    for (f, read) in checked.iter().zip(reads) {
        if !read.settings.traffic.canary {
            for key in host_paths(&f.ingress) {
                mains.entry(key).or_default().push(f);
            }
        }
    }
    mains
}

/// A canary whose main Ingress for a path is in another namespace only: not served there under
/// `--canary-scope namespace`, served (as ingress-nginx) under `cluster`; the `canary` key says so.
fn check_canary_scope(
    f: &Found,
    read: &mut nginx::Read,
    mains: &BTreeMap<HostPath<'_>, Vec<&Found>>,
    scope: CanaryScope,
) {
    if !read.settings.traffic.canary {
        return;
    }
    let (mut foreign, mut own) = (Vec::new(), false);
    for key in host_paths(&f.ingress) {
        let Some(list) = mains.get(&key) else {
            continue;
        };
        match list.iter().find(|m| m.namespace == f.namespace) {
            Some(_) => own = true,
            None => foreign.push(format!(
                "{}{} of Ingress {}/{}",
                key.0, key.1, list[0].namespace, list[0].name
            )),
        }
    }
    if foreign.is_empty() {
        return;
    }
    let foreign = foreign.join(", ");
    let key = format!("{}canary", nginx::PREFIX);
    for finding in read.findings.iter_mut().filter(|x| x.key == key) {
        if scope == CanaryScope::Cluster {
            finding.detail =
                format!("attaches across namespaces to {foreign} (--canary-scope=cluster)");
            continue;
        }
        finding.status = if own {
            Status::HonouredWithDifference
        } else {
            Status::IgnoredUnsupported
        };
        finding.detail = format!("not attached to {foreign}: another namespace's, and duet's --canary-scope=namespace (the default) confines canaries to their own; --canary-scope=cluster attaches it, as ingress-nginx");
    }
}

/// Reports the paths of an Ingress asking for regexes that duet cannot compile (the paths of
/// other Ingresses of its hosts are checked when duet serves them).
fn check_regex_paths(ingress: &StoredIngress, read: &mut nginx::Read) {
    for (_, path) in paths(ingress) {
        let written = written(path);
        if !read.settings.forces_regex(written) {
            continue;
        }
        let pattern = nginx::regex_pattern(written, &path.path_type, true);
        if let Some(error) = nginx::regex_error(pattern) {
            nginx::regex_failed(&mut read.findings, pattern, &error);
        }
    }
}

/// The class an Ingress names, as ingress-nginx reads it (`GetIngressClass`):
/// `spec.ingressClassName` first, then the legacy annotation.
fn class_of(ingress: &StoredIngress) -> Option<&str> {
    let annotation = || ingress.metadata.annotations.as_ref()?.get(CLASS_ANNOTATION);
    ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(annotation)
}

/// Every file's text: standard input for `-`, the manifests under a folder (sorted), or a file.
fn read_input(input: &Path) -> Result<Vec<(PathBuf, String)>, MigrateError> {
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MigrateError::Read { path, source }
    };
    if input == Path::new("-") {
        let mut text = String::new();
        io::stdin()
            .read_to_string(&mut text)
            .map_err(failed(input))?;
        return Ok(vec![(input.to_path_buf(), text)]);
    }
    let meta = std::fs::metadata(input).map_err(failed(input))?;
    if !meta.is_dir() {
        let text = std::fs::read_to_string(input).map_err(failed(input))?;
        return Ok(vec![(input.to_path_buf(), text)]);
    }
    let mut paths = Vec::new();
    collect(input, &mut paths).map_err(failed(input))?;
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            std::fs::read_to_string(&p)
                .map_err(failed(&p))
                .map(|t| (p, t))
        })
        .collect()
}

/// The manifest files under a folder, recursively.
fn collect(dir: &Path, paths: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, paths)?;
        } else if files::is_manifest(&path) {
            paths.push(path);
        }
    }
    Ok(())
}

/// The Ingresses of one file; other kinds are skipped, broken YAML or Ingresses are errors.
fn ingresses(path: &Path, text: &str) -> Result<Vec<Found>, MigrateError> {
    let parsed = files::parse(text, &[]);
    for problem in &parsed.problems {
        let about_ingress = problem
            .object
            .as_deref()
            .is_some_and(|o| o.starts_with("Ingress "));
        if problem.object.is_none() || about_ingress {
            let message = match &problem.object {
                Some(object) => {
                    format!("{object}: {}", problem.error.trim_end_matches("; skipped"))
                }
                None => problem
                    .error
                    .replace("; keeping the file's last good objects", ""),
            };
            return Err(MigrateError::Invalid {
                path: path.to_path_buf(),
                message,
            });
        }
    }
    Ok(parsed
        .objects
        .into_iter()
        .filter_map(|o| match o {
            Object::Ingress(ingress) => Some(Found {
                namespace: ingress
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                name: ingress.metadata.name.clone().unwrap_or_default(),
                ingress: (*ingress).clone(),
            }),
            _ => None,
        })
        .collect())
}

fn print_ingress(out: &mut dyn Write, f: &Found, findings: &[Finding]) -> io::Result<()> {
    writeln!(out, "Ingress {}/{}", f.namespace, f.name)?;
    if findings.is_empty() {
        return writeln!(out, "  (no {} annotations)\n", nginx::PREFIX);
    }
    let width = findings
        .iter()
        .map(|f| f.key.len())
        .max()
        .unwrap_or(0)
        .max(3);
    let status_width = "honoured-with-difference".len();
    writeln!(
        out,
        "  {:width$}  {:status_width$}  DETAIL",
        "KEY", "STATUS"
    )?;
    for finding in findings {
        writeln!(
            out,
            "  {:width$}  {:status_width$}  {}",
            finding.key,
            finding.status.as_str(),
            finding.detail
        )?;
    }
    writeln!(out)
}

fn print_summary(
    out: &mut dyn Write,
    args: &MigrateCheck,
    checked: usize,
    skipped: usize,
    clean: usize,
    all: &[Finding],
) -> io::Result<()> {
    let counts = nginx::count_by_status(all);
    let by_status: Vec<String> = Status::ALL
        .iter()
        .map(|s| format!("{} {}", counts[s], s))
        .collect();
    let plural = if checked == 1 { "" } else { "es" };
    write!(out, "Summary: {checked} Ingress{plural} checked")?;
    if let Some(class) = &args.ingress_class {
        write!(out, " ({skipped} of another class than {class} skipped)")?;
    }
    writeln!(
        out,
        ", {clean} fully honoured; {} annotations: {}",
        all.len(),
        by_status.join(", ")
    )
}
