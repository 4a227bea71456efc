//! JSON from the API server made safe to print: serde_json leaves DEL and
//! the C1 controls raw, and a terminal may obey them. Text lines go through
//! [`gpu_dra_driver::printable::escape`]; YAML escapes them itself.

/// serde_json's text with DEL and the C1 controls, which it writes raw
/// (JSON requires escapes only below U+0020), as `\u007f`, `\u009b`: the
/// same document, and no control reaches a terminal. They can only occur
/// inside strings, where `\uXXXX` means the same character.
pub fn json(text: String) -> String {
    if !text.chars().any(is_control_above_ascii_space) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_control_above_ascii_space(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// DEL and C1: the controls serde_json leaves raw.
fn is_control_above_ascii_space(c: char) -> bool {
    c.is_control() && u32::from(c) >= 0x7f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_stays_the_same_document_without_raw_controls() {
        let value = serde_json::json!({"productName": "x\x1b[2J\u{9b}y\x7fé"});
        let text = json(serde_json::to_string(&value).unwrap());
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert_eq!(text, r#"{"productName":"x\u001b[2J\u009by\u007fé"}"#);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), value);
    }

    #[test]
    fn yaml_escapes_them_itself() {
        let value = serde_json::json!({"productName": "x\x1b[2J\u{9b}y\x7f"});
        let text = serde_yaml_ng::to_string(&value).unwrap();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert_eq!(serde_yaml_ng::from_str::<serde_json::Value>(&text).unwrap(), value);
    }
}
