//! One object as read, before it is typed: the item of a JSON List kept as
//! its text (no tree is built for it; a ResourceSlice is decoded straight
//! from the text into its type), anything else as a tree. Its head
//! (apiVersion, kind, metadata.name and .namespace) is read at once, so the
//! reader can choose a type without a tree.

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// What identifies an object.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Head {
    pub api_version: String,
    pub kind: String,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

impl Head {
    pub fn of_tree(object: &Value) -> Head {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        Head {
            api_version: text(object.get("apiVersion")).unwrap_or_default(),
            kind: text(object.get("kind")).unwrap_or_default(),
            name: text(object.pointer("/metadata/name")),
            namespace: text(object.pointer("/metadata/namespace")),
        }
    }
}

/// The object's content.
#[derive(Debug)]
pub enum Body {
    /// A JSON object's text (an item of a JSON List), its syntax checked
    /// when its head was read.
    Json(Box<str>),
    /// A parsed tree (YAML, a whole JSON document, a converted object).
    Tree(Value),
}

/// Why an object cannot be read as a type: where (`spec.devices[0]`, `.`
/// for the object itself) and what serde said, without a text position
/// (it would be relative to the object, not the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub path: String,
    pub message: String,
}

/// The head of JSON text, reading the whole text (so its syntax is checked)
/// but building nothing but the head.
pub fn json_head(text: &str) -> Result<Head, serde_json::Error> {
    match serde_json::from_str::<LenientHead>(text) {
        Ok(h) => Ok(h.into_head()),
        // A duplicate field: the tree says which one counts (the last).
        Err(e) if e.is_data() => serde_json::from_str(text).map(|v| Head::of_tree(&v)),
        Err(e) => Err(e),
    }
}

impl Body {
    /// The content as a tree (to convert an older API version).
    pub fn into_tree(self) -> Value {
        match self {
            Body::Tree(v) => v,
            Body::Json(text) => serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    /// The content as `T`, an error naming the field that does not fit.
    pub fn decode<T: de::DeserializeOwned>(&self) -> Result<T, DecodeError> {
        match self {
            Body::Tree(v) => serde_path_to_error::deserialize(v)
                .map_err(|e| DecodeError { path: e.path().to_string(), message: e.into_inner().to_string() }),
            Body::Json(text) => {
                let mut de = serde_json::Deserializer::from_str(text);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let path = e.path().to_string();
                    let inner = e.into_inner();
                    let at = format!(" at line {} column {}", inner.line(), inner.column());
                    let message = inner.to_string();
                    let message = message.strip_suffix(&at).unwrap_or(&message).to_string();
                    DecodeError { path, message }
                })
            }
        }
    }
}

/// The head read from text: any field of an unexpected type is taken as
/// absent (as [`Head::of_tree`] does), everything else skipped unparsed.
#[derive(Deserialize)]
struct LenientHead {
    #[serde(default, rename = "apiVersion")]
    api_version: Lenient,
    #[serde(default)]
    kind: Lenient,
    #[serde(default)]
    metadata: LenientMeta,
}

impl LenientHead {
    fn into_head(self) -> Head {
        Head {
            api_version: self.api_version.0.unwrap_or_default(),
            kind: self.kind.0.unwrap_or_default(),
            name: self.metadata.name,
            namespace: self.metadata.namespace,
        }
    }
}

/// A string, or `None` for a value of any other type.
#[derive(Default)]
struct Lenient(Option<String>);

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Lenient, E> {
                Ok(Lenient(Some(v.to_string())))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Lenient, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Lenient, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// `metadata`'s name and namespace; a metadata that is not a mapping has
/// neither.
#[derive(Default)]
struct LenientMeta {
    name: Option<String>,
    namespace: Option<String>,
}

impl<'de> Deserialize<'de> for LenientMeta {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LenientMeta, A::Error> {
                let mut meta = LenientMeta::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "name" => meta.name = map.next_value::<Lenient>()?.0,
                        "namespace" => meta.namespace = map.next_value::<Lenient>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(meta)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<LenientMeta, E> {
                Ok(LenientMeta::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LenientMeta, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LenientMeta::default())
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Body {
        Body::Json(text.into())
    }

    #[test]
    fn the_head_is_read_from_text_as_from_a_tree() {
        for text in [
            r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "labels": {"a": "b"}}}"#,
            r#"{"kind": 3, "metadata": {"name": ["x"]}, "spec": {"deep": [[{}]]}}"#,
            r#"{"metadata": "nonsense", "apiVersion": null}"#,
            r#"{"kind": "A", "kind": "B"}"#,
        ] {
            let tree = Head::of_tree(&serde_json::from_str(text).unwrap());
            assert_eq!(json_head(text).unwrap(), tree, "{text}");
        }
        assert_eq!(json_head(r#"{"kind": "A", "kind": "B"}"#).unwrap().kind, "B");
        let err = json_head(r#"{"kind": "A", "spec": {"x": [1,}}"#).unwrap_err();
        assert!(err.is_syntax(), "{err}");
    }

    #[test]
    fn decode_errors_name_the_field_without_a_text_position() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct T {
            spec: Spec,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Spec {
            count: i64,
        }
        let text = r#"{"spec": {"count": "many"}}"#;
        let expected = DecodeError {
            path: "spec.count".to_string(),
            message: "invalid type: string \"many\", expected i64".to_string(),
        };
        assert_eq!(raw(text).decode::<T>().unwrap_err(), expected);
        assert_eq!(Body::Tree(serde_json::from_str(text).unwrap()).decode::<T>().unwrap_err(), expected);
    }
}
