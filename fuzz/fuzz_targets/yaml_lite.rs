//! Fuzzes the manifest reader `controller/src/source/yaml_lite.rs` differentially against
//! serde-saphyr: any text it reads gives exactly the documents (`serde_json::Value`s)
//! serde-saphyr gives, and no text makes it panic.

#![no_main]

#[path = "yaml_common.rs"]
mod yaml_common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    yaml_common::check(data, yaml_common::yaml_lite::documents);
});
