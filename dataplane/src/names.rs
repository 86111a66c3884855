//! Header names read on every request, as statics shared by the listener, the proxy and the
//! upstream clients: a `http::header::*` constant is a value, copied (a call to `memcpy`)
//! wherever it is used, and a static is one address.

use http::header::{self, HeaderName};

pub(crate) static CONNECTION: HeaderName = header::CONNECTION;
pub(crate) static CONTENT_LENGTH: HeaderName = header::CONTENT_LENGTH;
pub(crate) static TRANSFER_ENCODING: HeaderName = header::TRANSFER_ENCODING;
pub(crate) static UPGRADE: HeaderName = header::UPGRADE;
