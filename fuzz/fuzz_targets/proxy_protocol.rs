//! Fuzzes the PROXY protocol v1/v2 parser: any bytes give a header, "need more" or an error,
//! never a panic; a header never claims more bytes than it was given, and parsing is a pure
//! function of the bytes it claims (the same header comes back from exactly those bytes, and
//! from them followed by anything).

#![no_main]

use libfuzzer_sys::fuzz_target;

// The parser's own source, compiled here with only its dependencies (tokio, thiserror) rather
// than all of dataplane; it must stay free of `crate::` paths.
#[allow(dead_code)]
#[path = "../../dataplane/src/proxy_protocol.rs"]
mod proxy_protocol;

use proxy_protocol::parse;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((header, used))) = parse(data) {
        assert!(used <= data.len(), "claimed {used} of {} bytes", data.len());
        assert_eq!(parse(&data[..used]), Ok(Some((header, used))));
    }
});
