//! One document at a time into [`Manifest`]s, without a tree of the whole
//! document: the top-level mapping is read key by key, and a sequence under
//! `items` (a `List`) is read element by element, each element handed to
//! the sink as soon as it is complete.
//!
//! `kubectl get -o json` writes `items` before `kind`, so a top-level
//! `items` sequence is taken as a List's items when it is read; a document
//! that then turns out to be of another kind is refused.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::error::ReadError;
use super::manifest::{Manifest, Sink};
use super::split::{Piece, Splitter};

/// The sink's error, kept aside while serde unwinds with a placeholder.
struct Reader<'s, 'a, F> {
    sink: &'s mut Sink<'a, F>,
    failed: Option<F>,
}

impl<F: From<ReadError>> Reader<'_, '_, F> {
    fn give(&mut self, m: Manifest) -> Result<(), String> {
        (self.sink)(m).map_err(|e| {
            self.failed = Some(e);
            "stopped".to_string()
        })
    }

    /// The error to report: the sink's, or the parser's described.
    fn error(&mut self, parse: impl FnOnce() -> ReadError) -> F {
        self.failed.take().unwrap_or_else(|| parse().into())
    }

    /// Keeps the input's fault for [`Self::error`].
    fn refuse(&mut self, message: String) {
        self.failed = Some(ReadError::Invalid(message).into());
    }
}

/// A stream of JSON values (usually one), read from `input` as it comes:
/// split into documents and List items by [`Splitter`], each parsed from
/// memory (a List's items straight into [`Manifest`]s of text).
pub(super) fn json_stream<F: From<ReadError>>(
    origin: &str,
    input: impl std::io::BufRead,
    sink: &mut Sink<'_, F>,
) -> Result<(), F> {
    let mut reader = Reader { sink, failed: None };
    let (mut document, mut item) = (0usize, 0usize);
    let at = |document: usize| if document == 0 { origin.to_string() } else { format!("{origin}#{}", document + 1) };
    let mut handle = |piece: Piece<'_>| -> Result<(), F> {
        match piece {
            Piece::Item(bytes) => {
                let item_origin = format!("{} items[{item}]", at(document));
                let malformed = |e: &dyn std::fmt::Display| {
                    ReadError::Invalid(format!(
                        "{origin}: document {} items[{item}]: malformed JSON: {e} (within the item); fix the syntax \
                         there",
                        document + 1
                    ))
                };
                if bytes.first() != Some(&b'{') {
                    return Err(ReadError::Invalid(format!(
                        "{item_origin}: expected a Kubernetes object (a mapping with apiVersion and kind)"
                    ))
                    .into());
                }
                let text = std::str::from_utf8(bytes).map_err(|e| malformed(&e))?;
                let manifest = Manifest::json(item_origin, text.into()).map_err(|e| {
                    if e.to_string().starts_with("recursion limit exceeded") {
                        let too_deep = gpu_dra_driver::nesting::TooDeep { line: e.line() };
                        ReadError::Invalid(format!("{origin}: document {} items[{item}]: {too_deep}", document + 1))
                    } else {
                        malformed(&e)
                    }
                })?;
                item += 1;
                (reader.sink)(manifest)
            }
            Piece::Document(bytes) => {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                let result = DocumentSeed { origin: &at(document), reader: &mut reader }
                    .deserialize(&mut de)
                    .and_then(|()| de.end());
                if let Err(e) = result {
                    return Err(reader.error(|| json_error(origin, document, &e)));
                }
                document += 1;
                item = 0;
                Ok(())
            }
        }
    };
    Splitter::default().run(input, &mut handle, |e| ReadError::Invalid(format!("{origin}: cannot read: {e}")).into())
}

fn json_error(origin: &str, i: usize, e: &serde_json::Error) -> ReadError {
    let document = i + 1;
    if e.to_string().starts_with("recursion limit exceeded") {
        let too_deep = gpu_dra_driver::nesting::TooDeep { line: e.line() };
        return ReadError::Invalid(format!("{origin}: document {document}: {too_deep}"));
    }
    ReadError::Invalid(format!("{origin}: document {document}: malformed JSON: {e}; fix the syntax there"))
}

/// A YAML stream (`---`-separated documents).
pub(super) fn yaml_stream<F: From<ReadError>>(origin: &str, text: &str, sink: &mut Sink<'_, F>) -> Result<(), F> {
    let mut reader = Reader { sink, failed: None };
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let at = if i == 0 { origin.to_string() } else { format!("{origin}#{}", i + 1) };
        if let Err(e) = (DocumentSeed { origin: &at, reader: &mut reader }).deserialize(doc) {
            return Err(reader.error(|| {
                ReadError::Invalid(format!("{origin}: document {}: malformed YAML: {e}; fix the syntax there", i + 1))
            }));
        }
    }
    Ok(())
}

/// One document: an object, a List of objects, or nothing.
struct DocumentSeed<'r, 's, 'a, F> {
    origin: &'r str,
    reader: &'r mut Reader<'s, 'a, F>,
}

impl<'de, F: From<ReadError>> DeserializeSeed<'de> for DocumentSeed<'_, '_, '_, F> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<F: From<ReadError>> DocumentSeed<'_, '_, '_, F> {
    fn not_an_object<E: de::Error>(self) -> Result<(), E> {
        self.reader
            .refuse(format!("{}: expected a Kubernetes object (a mapping with apiVersion and kind)", self.origin));
        Err(E::custom("stopped"))
    }
}

impl<'de, F: From<ReadError>> Visitor<'de> for DocumentSeed<'_, '_, '_, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object (a mapping with apiVersion and kind)")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.not_an_object()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.not_an_object()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.not_an_object()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.not_an_object()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.not_an_object()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.not_an_object()
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut object = Map::new();
        let mut streamed = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" && !streamed {
                let seed = ItemsSeed { origin: self.origin, reader: &mut *self.reader };
                match map.next_value_seed(seed)? {
                    Items::Streamed => streamed = true,
                    Items::Other(value) => {
                        object.insert(key, value);
                    }
                }
            } else {
                let value: Value = map.next_value()?;
                object.insert(key, value);
            }
        }
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        let list = kind == "List" || kind.ends_with("List");
        if streamed && !list {
            self.reader.refuse(format!(
                "{}: kind {kind:?} has a top-level items list, which only a List (or a kind ending in List) has; \
                 fix: write the objects as a List or one document each",
                self.origin
            ));
            return Err(de::Error::custom("stopped"));
        }
        if streamed {
            return Ok(());
        }
        if kind == "List" {
            self.reader
                .refuse(format!("{}: a List needs an items array; fix: list the objects under items:", self.origin));
            return Err(de::Error::custom("stopped"));
        }
        let origin = self.origin.to_string();
        self.reader.give(Manifest::tree(origin, Value::Object(object))).map_err(de::Error::custom)
    }
}

/// A top-level `items`: a sequence streamed to the sink, or any other value.
enum Items {
    Streamed,
    Other(Value),
}

/// (A JSON List's items were split out before: only YAML's arrive here.)
struct ItemsSeed<'r, 's, 'a, F> {
    origin: &'r str,
    reader: &'r mut Reader<'s, 'a, F>,
}

impl<'de, F: From<ReadError>> DeserializeSeed<'de> for ItemsSeed<'_, '_, '_, F> {
    type Value = Items;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Items, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Anything but a sequence is read as a plain value.
macro_rules! other {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Items, E> {
            Value::deserialize(v.into_deserializer()).map(Items::Other)
        }
    )*};
}

use serde::Deserialize as _;

impl<'de, F: From<ReadError>> Visitor<'de> for ItemsSeed<'_, '_, '_, F> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of Kubernetes objects")
    }

    other!(visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_string(String));

    fn visit_unit<E: de::Error>(self) -> Result<Items, E> {
        Ok(Items::Other(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<Items, E> {
        Ok(Items::Other(Value::Null))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Items::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        let mut j = 0usize;
        while let Some(object) = seq.next_element::<Value>()? {
            let origin = format!("{} items[{j}]", self.origin);
            if !object.is_object() {
                self.reader
                    .refuse(format!("{origin}: expected a Kubernetes object (a mapping with apiVersion and kind)"));
                return Err(de::Error::custom("stopped"));
            }
            self.reader.give(Manifest::tree(origin, object)).map_err(de::Error::custom)?;
            j += 1;
        }
        Ok(Items::Streamed)
    }
}
