//! What the `yaml_lite` and `yaml_fast` targets share: the readers' own source, compiled here
//! with only their dependencies (serde-saphyr, serde_json; `yaml_lite` names
//! `super::yaml_fast`, this module here), and the differential check against serde-saphyr.

use serde_json::Value;

#[allow(dead_code)]
#[path = "../../controller/src/source/yaml_fast.rs"]
pub mod yaml_fast;

#[allow(dead_code)]
#[path = "../../controller/src/source/yaml_lite.rs"]
pub mod yaml_lite;

/// Any text `read` takes (`Some`) must give exactly the documents serde-saphyr gives, as
/// `files::parse` asks for them; it may decline any text (the caller falls back).
pub fn check(data: &[u8], read: fn(&str) -> Option<Vec<Value>>) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(read) = read(text) {
        let options = serde_saphyr::options! { with_snippet: false };
        let reference = serde_saphyr::from_multiple_with_options(text, options).ok();
        assert_eq!(Some(read), reference, "read differently: {text:?}");
    }
}
