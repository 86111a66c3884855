//! The generated Gateway API types (controller/src/gateway_api) against upstream manifests: every
//! GatewayClass, Gateway, HTTPRoute, GRPCRoute and ReferenceGrant document in
//! tests/fixtures/gateway (the upstream examples/standard of sigs.k8s.io/gateway-api v1.6.3 and
//! some of its conformance manifests, copied unmodified) decodes, and encodes back to exactly the
//! same JSON, so no field a manifest uses is dropped or renamed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use controller::gateway_api::{
    self as api, Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, BUNDLE_VERSION,
};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gateway")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("fixture folder") {
        let path = entry.expect("fixture entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    out.sort();
}

/// Every document of every fixture file, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&fixtures(), &mut files);
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("fixture text");
        let name = file.strip_prefix(fixtures()).unwrap().display().to_string();
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{name} is not YAML: {e}"));
        docs.extend(
            parsed
                .into_iter()
                .filter(|d| !d.is_null())
                .map(|d| (name.clone(), d)),
        );
    }
    docs
}

/// The first path at which two JSON values differ, for a readable failure.
fn first_difference(path: &str, want: &Value, got: &Value) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let keys: std::collections::BTreeSet<_> = w.keys().chain(g.keys()).collect();
            keys.into_iter().find_map(|k| match (w.get(k), g.get(k)) {
                (Some(wv), Some(gv)) => first_difference(&format!("{path}.{k}"), wv, gv),
                (Some(_), None) => Some(format!("{path}.{k} was dropped")),
                (None, Some(_)) => Some(format!("{path}.{k} was added")),
                (None, None) => None,
            })
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .find_map(|(i, (wv, gv))| first_difference(&format!("{path}[{i}]"), wv, gv)),
        _ if want == got => None,
        _ => Some(format!("{path}: {want} became {got}")),
    }
}

/// Decodes `doc` as K and encodes it back; the two JSON values must be equal.
fn round_trip<K: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> Result<K, String> {
    let typed: K = serde_json::from_value(doc.clone()).map_err(|e| format!("{file}: {e}"))?;
    let back = serde_json::to_value(&typed).expect("encode");
    match first_difference("", doc, &back) {
        None => Ok(typed),
        Some(diff) => Err(format!("{file}: {diff}")),
    }
}

/// Round-trips one document by its kind; `None` for kinds duet does not serve.
fn round_trip_any(file: &str, doc: &Value) -> Option<Result<(), String>> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let result = match kind {
        "GatewayClass" => round_trip::<GatewayClass>(file, doc).map(drop),
        "Gateway" => round_trip::<Gateway>(file, doc).map(drop),
        "HTTPRoute" => round_trip::<HttpRoute>(file, doc).map(drop),
        "GRPCRoute" => round_trip::<GrpcRoute>(file, doc).map(drop),
        "ReferenceGrant" => round_trip::<ReferenceGrant>(file, doc).map(drop),
        _ => return None,
    };
    Some(result)
}

#[test]
fn every_upstream_manifest_of_our_kinds_round_trips() {
    let mut counts = BTreeMap::<String, usize>::new();
    let mut failures = Vec::new();
    for (file, doc) in documents() {
        if doc["apiVersion"].as_str() != Some("gateway.networking.k8s.io/v1") {
            continue;
        }
        if let Some(result) = round_trip_any(&file, &doc) {
            *counts
                .entry(doc["kind"].as_str().unwrap().to_owned())
                .or_default() += 1;
            failures.extend(result.err());
        }
    }
    assert!(
        failures.is_empty(),
        "{} documents lost fields:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The fixture folder holds exactly these: a lost file fails here rather than passing quietly.
    let want: BTreeMap<String, usize> = [
        ("GRPCRoute", 12),
        ("Gateway", 36),
        ("GatewayClass", 5),
        ("HTTPRoute", 72),
        ("ReferenceGrant", 10),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(counts, want, "documents per kind in the fixtures");
}

#[test]
fn every_document_of_the_gateway_group_is_v1() {
    for (file, doc) in documents() {
        let version = doc["apiVersion"].as_str().unwrap_or_default();
        if let Some(v) = version.strip_prefix("gateway.networking.k8s.io/") {
            let ours = round_trip_any(&file, &doc).is_some();
            assert!(
                !ours || v == "v1",
                "{file}: {} at {v}; the types are v1",
                doc["kind"]
            );
        }
    }
}

#[test]
fn the_types_name_the_served_resources() {
    fn check<K: Resource<DynamicType = ()>>(kind: &str, plural: &str) {
        assert_eq!(K::group(&()), api::GROUP);
        assert_eq!(K::version(&()), "v1");
        assert_eq!(K::kind(&()), kind);
        assert_eq!(K::plural(&()), plural);
        assert_eq!(K::api_version(&()), "gateway.networking.k8s.io/v1");
    }
    check::<GatewayClass>("GatewayClass", "gatewayclasses");
    check::<Gateway>("Gateway", "gateways");
    check::<HttpRoute>("HTTPRoute", "httproutes");
    check::<GrpcRoute>("GRPCRoute", "grpcroutes");
    check::<ReferenceGrant>("ReferenceGrant", "referencegrants");
    assert_eq!(BUNDLE_VERSION, "v1.6.3");
}

fn find(file: &str, kind: &str, name: &str) -> Value {
    documents()
        .into_iter()
        .find(|(f, d)| f == file && d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {file}"))
        .1
}

/// The fields duet will route by read as the manifests say.
#[test]
fn routing_fields_read_as_written() {
    let doc = find(
        "conformance/tests/httproute-rewrite-path.yaml",
        "HTTPRoute",
        "rewrite-path",
    );
    let route: HttpRoute = round_trip("rewrite-path", &doc).unwrap();
    let rule = &route.spec.rules.as_ref().unwrap()[0];
    let path = rule.matches.as_ref().unwrap()[0].path.as_ref().unwrap();
    assert_eq!(path.value.as_deref(), Some("/prefix/one"));
    let rewrite = rule.filters.as_ref().unwrap()[0]
        .url_rewrite
        .as_ref()
        .unwrap();
    let rewrite_path = rewrite.path.as_ref().unwrap();
    assert_eq!(rewrite_path.replace_prefix_match.as_deref(), Some("/one"));

    let doc = find(
        "conformance/tests/grpcroute-exact-method-matching.yaml",
        "GRPCRoute",
        "exact-matching",
    );
    let route: GrpcRoute = round_trip("exact-matching", &doc).unwrap();
    let method = route.spec.rules.as_ref().unwrap()[0]
        .matches
        .as_ref()
        .unwrap()[0]
        .method
        .as_ref()
        .unwrap();
    assert_eq!(
        method.service.as_deref(),
        Some("gateway_api_conformance.echo_basic.grpcecho.GrpcEcho")
    );
    assert_eq!(method.method.as_deref(), Some("Echo"));

    let doc = find(
        "conformance/base/manifests.yaml",
        "Gateway",
        "same-namespace-with-https-listener",
    );
    let gateway: Gateway = round_trip("base", &doc).unwrap();
    assert_eq!(gateway.spec.listeners.len(), 4);
    for listener in &gateway.spec.listeners {
        assert_eq!((listener.port, listener.protocol.as_str()), (443, "HTTPS"));
        let refs = listener
            .tls
            .as_ref()
            .unwrap()
            .certificate_refs
            .as_ref()
            .unwrap();
        assert_eq!(refs[0].name, "tls-validity-checks-certificate");
    }
}

/// A Gateway's status lists one address per family, in the order duet writes them (the
/// cluster's family order): both survive, in order, with their type.
#[test]
fn dual_stack_status_addresses_keep_their_order() {
    for (first, second) in [
        ("192.0.2.10", "2001:db8::10"),
        ("2001:db8::10", "192.0.2.10"),
    ] {
        let doc = json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "dual", "namespace": "default", "generation": 3},
            "spec": {"gatewayClassName": "duet", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
            "status": {"addresses": [
                {"type": "IPAddress", "value": first},
                {"type": "IPAddress", "value": second}
            ]}
        });
        let gateway: Gateway = round_trip("dual", &doc).unwrap();
        let addresses = gateway.status.unwrap().addresses.unwrap();
        let values: Vec<_> = addresses.iter().map(|a| a.value.as_str()).collect();
        assert_eq!(values, [first, second]);
        assert!(addresses
            .iter()
            .all(|a| a.r#type.as_deref() == Some("IPAddress")));
    }
}

/// Hostile objects are refused with an error, not a panic and not a silently empty value.
#[test]
fn objects_missing_required_fields_or_with_unknown_values_are_refused() {
    let base = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "g"},
        "spec": {"gatewayClassName": "duet", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
    });
    assert!(serde_json::from_value::<Gateway>(base.clone()).is_ok());
    let mut no_listeners = base.clone();
    no_listeners["spec"]
        .as_object_mut()
        .unwrap()
        .remove("listeners");
    assert!(serde_json::from_value::<Gateway>(no_listeners).is_err());
    let mut port_text = base.clone();
    port_text["spec"]["listeners"][0]["port"] = json!("eighty");
    assert!(serde_json::from_value::<Gateway>(port_text).is_err());

    // A value the v1.6.3 standard schema does not have (a newer or experimental CRD) fails the
    // whole object: the watcher must decode per object (README, "Gateway API (in progress)").
    let route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {"rules": [{"matches": [{"path": {"type": "Glob", "value": "/*"}}]}]}
    });
    let err = serde_json::from_value::<HttpRoute>(route).unwrap_err();
    assert!(err.to_string().contains("Glob"), "{err}");
}
