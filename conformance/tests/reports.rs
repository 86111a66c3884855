//! The Gateway API conformance reports committed under `conformance/reports/` (written there by
//! `conformance/reports/update.sh` from a `duet-conformance gateway` run): named as the upstream
//! repository's `conformance/reports/` folder asks (`CHANNEL-VERSION-MODE-report.yaml`, each
//! part equal to the report's own field), of the Gateway API version the suite pins, of this
//! workspace's version, one per channel and family order, listed in the folder's README, with
//! no failed test; and the GatewayClass's `status.supportedFeatures`
//! (`controller/src/gateway/class.rs`) lists exactly the features the reports claim.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

const GATEWAY_API: &str = "v1.6.3";

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("reports")
        .join(GATEWAY_API)
        .join("duet")
}

fn reports() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(folder())
        .expect("conformance/reports/v1.6.3/duet exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let value: Value = serde_saphyr::from_str(&text).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The quoted names of `SUPPORTED_FEATURES` in class.rs.
fn gateway_class_features() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controller/src/gateway/class.rs");
    let src = std::fs::read_to_string(path).unwrap();
    let start = src
        .find("SUPPORTED_FEATURES: &[&str] = &[")
        .expect("the list");
    let block = &src[start..start + src[start..].find("];").unwrap()];
    block
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

#[test]
fn one_report_per_channel_and_family_order_named_by_its_content() {
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    let reports = reports();
    let names: Vec<&str> = reports.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = Vec::new();
    for channel in ["experimental", "standard"] {
        for mode in ["ipv4-primary", "ipv6-primary"] {
            want.push(format!("{channel}-{version}-{mode}-report.yaml"));
        }
    }
    assert_eq!(
        names, want,
        "run conformance/reports/update.sh after a full run"
    );
    let readme = std::fs::read_to_string(folder().join("README.md")).unwrap();
    for (name, report) in &reports {
        assert_eq!(str_at(report, "/kind"), "ConformanceReport", "{name}");
        assert_eq!(str_at(report, "/gatewayAPIVersion"), GATEWAY_API, "{name}");
        let named = format!(
            "{}-{}-{}-report.yaml",
            str_at(report, "/gatewayAPIChannel"),
            str_at(report, "/implementation/version"),
            str_at(report, "/mode")
        );
        assert_eq!(&named, name, "the name disagrees with the content");
        assert!(
            readme.contains(&format!("(./{name})")),
            "README lacks {name}"
        );
    }
}

#[test]
fn no_test_failed_and_the_gateway_class_lists_what_the_reports_claim() {
    let core_kinds = [
        "Gateway",
        "HTTPRoute",
        "GRPCRoute",
        "ReferenceGrant",
        "TLSRoute",
    ];
    let mut claimed = BTreeSet::new();
    for (name, report) in reports() {
        let profiles = report["profiles"].as_array().expect("profiles");
        assert!(!profiles.is_empty(), "{name}: no profile ran");
        for profile in profiles {
            let profile_name = str_at(profile, "/name");
            for part in ["core", "extended"] {
                let failed = profile[part]["statistics"]["Failed"].as_u64().unwrap_or(0);
                assert_eq!(failed, 0, "{name}: {profile_name} {part} failed tests");
            }
            let features = profile["extended"]["supportedFeatures"].as_array();
            claimed.extend(
                features
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.as_str().map(str::to_owned)),
            );
        }
    }
    let listed: BTreeSet<String> = gateway_class_features()
        .into_iter()
        .filter(|f| !core_kinds.contains(&f.as_str()))
        .collect();
    assert_eq!(
        listed, claimed,
        "class.rs SUPPORTED_FEATURES against the reports' claims"
    );
}
