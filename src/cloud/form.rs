//! `application/x-www-form-urlencoded` bodies and query strings, encoded as
//! the clouds' SDKs encode them: everything but RFC 3986's unreserved
//! characters percent-escaped (a space is `%20`, never `+`).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters is escaped.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `name=value&...`, in the order given.
pub fn encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// One name or value, escaped.
pub fn escape(s: &str) -> String {
    utf8_percent_encode(s, ESCAPED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(
            encode(&[("UserData", "dQ=="), ("V", "$Default a~b")]),
            "UserData=dQ%3D%3D&V=%24Default%20a~b"
        );
        assert_eq!(
            escape("https://management.azure.com/.default"),
            "https%3A%2F%2Fmanagement.azure.com%2F.default"
        );
    }
}
