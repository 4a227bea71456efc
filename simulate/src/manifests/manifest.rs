//! One object read from a manifest, kept as its JSON text or as a tree,
//! with its head (kind, apiVersion, name, namespace) read once.

use super::object::{self, Body, DecodeError, Head};

/// One object read from a manifest, with where it came from.
#[derive(Debug)]
pub struct Manifest {
    /// `file` or `file#doc` for documents after the first, `file items[i]`
    /// for the items of a List.
    pub origin: String,
    head: Head,
    body: Body,
}

impl Manifest {
    /// An object read as a tree.
    pub fn tree(origin: String, object: serde_json::Value) -> Self {
        Manifest { origin, head: Head::of_tree(&object), body: Body::Tree(object) }
    }

    /// An object kept as its JSON text; refused if the text is not JSON.
    pub fn json(origin: String, text: Box<str>) -> Result<Self, serde_json::Error> {
        Ok(Manifest { origin, head: object::json_head(&text)?, body: Body::Json(text) })
    }

    pub fn kind(&self) -> &str {
        &self.head.kind
    }

    pub fn api_version(&self) -> &str {
        &self.head.api_version
    }

    /// `metadata.name`, `<unnamed>` when absent or not a string.
    pub fn name(&self) -> &str {
        self.head.name.as_deref().unwrap_or("<unnamed>")
    }

    /// `metadata.name` as written, if a string.
    pub fn given_name(&self) -> Option<&str> {
        self.head.name.as_deref()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.head.namespace.as_deref()
    }

    /// The object as `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, DecodeError> {
        self.body.decode()
    }

    /// The object as a tree, changed by `convert`, its head read again.
    pub fn converted(self, convert: impl FnOnce(&mut serde_json::Value)) -> Self {
        let mut tree = self.body.into_tree();
        convert(&mut tree);
        Manifest::tree(self.origin, tree)
    }
}

/// Where every object read goes; its error (the caller's, `E`) stops the
/// reading and is returned as it is.
pub type Sink<'a, E> = dyn FnMut(Manifest) -> Result<(), E> + 'a;
