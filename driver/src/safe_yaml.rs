//! The one way YAML from a user or a file is made ready for the parser:
//! hostile nesting refused first ([`crate::nesting`]), JSON's surrogate-pair
//! escapes rewritten as YAML reads them ([`crate::json_escapes`]). The fake
//! inventory, `simulate`'s fleets and the manifest reader all go through it.

use std::borrow::Cow;

use crate::nesting::TooDeep;

/// `text` checked and ready for `serde_yaml_ng`.
pub fn prepare(text: &str) -> Result<Cow<'_, str>, TooDeep> {
    crate::nesting::check(text)?;
    Ok(crate::json_escapes::to_yaml(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_deep_nesting_and_rewrites_surrogate_pairs() {
        assert!(prepare(&"[".repeat(200)).is_err());
        assert_eq!(prepare(r#"a: "\ud83d\ude00""#).unwrap(), r#"a: "\U0001F600""#);
        assert!(matches!(prepare("a: 1").unwrap(), Cow::Borrowed("a: 1")));
    }
}
