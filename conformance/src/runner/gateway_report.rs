//! The upstream Gateway API `ConformanceReport` (YAML, `sigs.k8s.io/gateway-api/conformance/
//! apis/v1`) as `duet-conformance gateway` reads it: per profile the core and extended results,
//! each with its statistics and the names of its failed tests.

use serde::Deserialize;

/// The part of a report the runner prints.
#[derive(Debug, Deserialize)]
pub struct Report {
    /// One per conformance profile that ran; `null` when the suite's setup failed (no test ran).
    #[serde(default)]
    pub profiles: Option<Vec<ProfileReport>>,
}

/// A profile's results (`GATEWAY-HTTP`, `GATEWAY-GRPC`).
#[derive(Debug, Deserialize)]
pub struct ProfileReport {
    /// The profile's name.
    pub name: String,
    /// Its core tests.
    pub core: Status,
    /// Its extended tests (absent when none of its extended features was supported).
    #[serde(default)]
    pub extended: Option<Status>,
}

/// The outcome of a set of tests.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `success`, `partial` or `failure`.
    #[serde(default)]
    pub result: String,
    /// How many passed, failed and were skipped.
    #[serde(default)]
    pub statistics: Statistics,
    /// The failed tests' names.
    #[serde(default)]
    pub failed_tests: Vec<String>,
    /// The features of the profile's extended part the run did not claim (extended only).
    #[serde(default)]
    pub unsupported_features: Vec<String>,
}

/// Test counts; the upstream type has no JSON tags, so the keys are its Go field names.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Statistics {
    /// Tests that passed.
    #[serde(default)]
    pub passed: u32,
    /// Tests that failed.
    #[serde(default)]
    pub failed: u32,
    /// Tests not run (an unsupported feature, `-run-test` naming another, `-skip-tests`).
    #[serde(default)]
    pub skipped: u32,
}

impl Report {
    /// Parses the YAML a suite run wrote.
    pub fn parse(yaml: &str) -> anyhow::Result<Report> {
        Ok(serde_saphyr::from_str(yaml)?)
    }

    /// The profiles' results (none when the suite's setup failed).
    pub fn profiles(&self) -> &[ProfileReport] {
        self.profiles.as_deref().unwrap_or_default()
    }

    /// Whether any test ran: the suite writes `profiles: null` when its setup (base manifests,
    /// Gateways `Programmed`, pods ready) failed before the first test.
    pub fn ran(&self) -> bool {
        !self.profiles().is_empty()
    }

    /// `PROFILE core: N passed, N failed, N skipped` and the same for extended, for every
    /// profile of `names` (in that order; a profile the report lacks counts nothing).
    pub fn lines(&self, names: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        for name in names {
            let profile = self.profiles().iter().find(|p| p.name == *name);
            let none = Status::default();
            let core = profile.map_or(&none, |p| &p.core);
            let extended = profile.and_then(|p| p.extended.as_ref()).unwrap_or(&none);
            for (part, status) in [("core", core), ("extended", extended)] {
                let s = &status.statistics;
                out.push(format!(
                    "{name} {part}: {} passed, {} failed, {} skipped",
                    s.passed, s.failed, s.skipped
                ));
            }
        }
        out
    }

    /// The failed core tests of every profile, `PROFILE/Test`.
    pub fn failed_core(&self) -> Vec<String> {
        self.profiles()
            .iter()
            .flat_map(|p| failed_of(&p.name, &p.core))
            .collect()
    }

    /// The failed tests of every profile, core and extended, `PROFILE/Test`.
    pub fn failed(&self) -> Vec<String> {
        self.profiles()
            .iter()
            .flat_map(|p| {
                let extended = p.extended.iter().flat_map(|e| failed_of(&p.name, e));
                failed_of(&p.name, &p.core).chain(extended)
            })
            .collect()
    }

    /// `PROFILE unsupported: A, B` for every profile with extended features not claimed.
    pub fn unsupported_lines(&self) -> Vec<String> {
        self.profiles()
            .iter()
            .filter_map(|p| {
                let e = p.extended.as_ref()?;
                let list = &e.unsupported_features;
                (!list.is_empty()).then(|| format!("{} unsupported: {}", p.name, list.join(", ")))
            })
            .collect()
    }
}

/// The failed tests of one part of a profile, `PROFILE/Test`; a count without names still counts.
fn failed_of<'a>(profile: &'a str, status: &'a Status) -> impl Iterator<Item = String> + 'a {
    let named = status
        .failed_tests
        .iter()
        .map(move |t| format!("{profile}/{t}"));
    let unnamed = (status.statistics.failed as usize).saturating_sub(status.failed_tests.len());
    named.chain((0..unnamed).map(move |_| format!("{profile}/(unnamed)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape `sigs.k8s.io/gateway-api/conformance` v1.6.3 writes (abridged from a run).
    const REPORT: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
date: "2026-12-01T11:40:00Z"
gatewayAPIChannel: standard
gatewayAPIVersion: v1.6.3
implementation:
  contact:
  - https://github.com/duet-dev/duet/issues
  organization: duet-dev
  project: duet
  url: https://github.com/duet-dev/duet
  version: v0.1.0
kind: ConformanceReport
mode: default
profiles:
- core:
    failedTests:
    - GatewayWithAttachedRoutes
    - HTTPRouteSimpleSameNamespace
    result: failure
    skippedTests:
    - HTTPRouteWeight
    statistics:
      Failed: 2
      Passed: 30
      Skipped: 1
  name: GATEWAY-HTTP
  summary: Core tests failed with 2 test failures.
  extended:
    failedTests:
    - HTTPRouteRequestMirror
    result: failure
    statistics:
      Failed: 1
      Passed: 3
      Skipped: 0
    supportedFeatures:
    - HTTPRouteQueryParamMatching
    - HTTPRouteRequestMirror
    unsupportedFeatures:
    - HTTPRouteCORS
    - ListenerSet
- core:
    result: success
    statistics:
      Failed: 0
      Passed: 2
      Skipped: 0
  name: GATEWAY-GRPC
  summary: Core tests succeeded.
"#;

    #[test]
    fn counts_are_read_per_profile_and_part() {
        let report = Report::parse(REPORT).unwrap();
        assert_eq!(
            report.lines(&["GATEWAY-HTTP", "GATEWAY-GRPC"]),
            [
                "GATEWAY-HTTP core: 30 passed, 2 failed, 1 skipped",
                "GATEWAY-HTTP extended: 3 passed, 1 failed, 0 skipped",
                "GATEWAY-GRPC core: 2 passed, 0 failed, 0 skipped",
                "GATEWAY-GRPC extended: 0 passed, 0 failed, 0 skipped",
            ]
        );
        assert_eq!(
            report.failed_core(),
            [
                "GATEWAY-HTTP/GatewayWithAttachedRoutes",
                "GATEWAY-HTTP/HTTPRouteSimpleSameNamespace"
            ]
        );
        assert_eq!(
            report.failed().last().map(String::as_str),
            Some("GATEWAY-HTTP/HTTPRouteRequestMirror"),
            "extended failures count too"
        );
        assert_eq!(report.failed().len(), 3);
        assert_eq!(
            report.unsupported_lines(),
            ["GATEWAY-HTTP unsupported: HTTPRouteCORS, ListenerSet"]
        );
    }

    #[test]
    fn a_profile_that_did_not_run_counts_nothing_and_garbage_is_an_error() {
        // What the suite writes when its setup fails (no Gateway became Programmed).
        let report = Report::parse("kind: ConformanceReport\nprofiles: null\n").unwrap();
        assert!(!report.ran());
        assert_eq!(
            report.lines(&["GATEWAY-GRPC"])[0],
            "GATEWAY-GRPC core: 0 passed, 0 failed, 0 skipped"
        );
        assert!(report.failed_core().is_empty());
        assert!(Report::parse(REPORT).unwrap().ran());
        assert!(Report::parse("profiles: [{name: 1, core: 7}]").is_err());
    }
}
