//! ingress-nginx's `ssl-passthrough`: the HTTPS connections whose TLS server name is a host of
//! the Ingress are relayed unterminated to the backend of the host's `/` rule. As in
//! ingress-nginx it needs a controller flag (`--enable-ssl-passthrough`); without it the key has
//! no effect and is reported so. The Ingress's other annotations do not apply to the relayed
//! connections (its plain-HTTP requests still get them, as in ingress-nginx).

use super::{Read, Status, PREFIX};

/// The key this module reads (after the prefix).
pub const KEY: &str = "ssl-passthrough";

/// Whether this module reads a key.
pub fn reads(name: &str) -> bool {
    name == KEY
}

/// Applies the key's value (a boolean as Go reads it).
pub fn apply(value: &str, passthrough: &mut bool) -> Result<(), String> {
    *passthrough = super::parse_bool(value)?;
    Ok(())
}

/// Without `--enable-ssl-passthrough` the key is not applied; with it, the other honoured keys
/// say that they do not reach the relayed connections.
pub fn settle(read: &mut Read, enabled: bool) {
    if !read.settings.ssl_passthrough {
        return;
    }
    let own = format!("{PREFIX}{KEY}");
    if !enabled {
        read.settings.ssl_passthrough = false;
        for f in read.findings.iter_mut().filter(|f| f.key == own) {
            f.status = Status::IgnoredUnsupported;
            f.detail = "no effect without duet's --enable-ssl-passthrough (ingress-nginx needs its --enable-ssl-passthrough too): TLS is terminated by duet".to_owned();
        }
        return;
    }
    for f in read
        .findings
        .iter_mut()
        .filter(|f| f.key != own && f.key.starts_with(PREFIX) && f.status.is_honoured())
    {
        let note =
            "not applied to the HTTPS connections relayed by ssl-passthrough (plain HTTP only)";
        f.detail = if f.detail.is_empty() {
            note.to_owned()
        } else {
            format!("{}; {note}", f.detail)
        };
    }
}
