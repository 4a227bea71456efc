//! Splitting a stream of JSON values into documents, and a document's
//! top-level `items` array into its elements, by scanning bytes: strings
//! (with escapes) and nesting are tracked, nothing is parsed. Each element
//! of `items` is handed on as its own text (and dropped from the document,
//! whose `items` becomes `[]`), so a List of thousands of ResourceSlices is
//! never held whole, and each item is parsed once, from memory, into its
//! type. serde_json reading from an `io::Read` goes byte by byte through
//! a position-tracking iterator: on a 194 MiB List that was a third of
//! `simulate`'s start.
//!
//! The scan checks no syntax: the parser that reads each piece does, and
//! an unfinished value at the end is handed on as it is, for the parser to
//! name what is missing.

use std::io::BufRead;

/// What the scan found.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// One element of the current document's top-level `items` array.
    Item(&'a [u8]),
    /// A whole top-level value (with `items` emptied if it was streamed).
    Document(&'a [u8]),
}

/// Bytes that matter outside strings.
const fn structural() -> [bool; 256] {
    let mut table = [false; 256];
    let special = b"\"{}[],:";
    let mut i = 0;
    while i < special.len() {
        table[special[i] as usize] = true;
        i += 1;
    }
    table
}

const STRUCTURAL: [bool; 256] = structural();

/// Where a scalar at the top level or in `items` ends.
fn ends_scalar(b: u8) -> bool {
    b.is_ascii_whitespace() || STRUCTURAL[usize::from(b)]
}

/// The scanner's state between chunks.
#[derive(Debug, Default)]
pub struct Splitter {
    /// The current document (without streamed items).
    doc: Vec<u8>,
    /// The current item of `items`.
    item: Vec<u8>,
    /// Nesting depth in the document (0: between documents).
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// A top-level scalar (a number, `true`...) being read.
    in_scalar: bool,
    /// The document is an object (only then can it have `items`).
    object: bool,
    /// At depth 1 of an object: the next string is a key.
    expect_key: bool,
    /// The key being read at depth 1 (its raw bytes), and the last one read.
    key: Vec<u8>,
    reading_key: bool,
    last_key_is_items: bool,
    /// Inside the streamed `items` array (depth 2 is its elements' level).
    in_items: bool,
    items_done: bool,
    /// An element of `items` is being read (a scalar element: `item_scalar`).
    in_item: bool,
    item_scalar: bool,
}

impl Splitter {
    /// Scans all of `input`, handing each piece to `emit` as it completes.
    pub fn run<E>(
        mut self,
        mut input: impl BufRead,
        emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>,
        io_error: impl Fn(std::io::Error) -> E,
    ) -> Result<(), E> {
        loop {
            let chunk = match input.fill_buf() {
                Ok(chunk) => chunk,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(e)),
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len();
            self.feed(chunk, emit)?;
            input.consume(n);
        }
        self.finish(emit)
    }

    /// Whether the byte goes to the item rather than the document.
    fn to_item(&self) -> bool {
        self.in_item
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.to_item() {
            self.item.extend_from_slice(bytes)
        } else {
            self.doc.extend_from_slice(bytes)
        }
        if self.reading_key {
            self.key.extend_from_slice(bytes);
        }
    }

    fn feed<E>(&mut self, chunk: &[u8], emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>) -> Result<(), E> {
        let mut i = 0;
        while i < chunk.len() {
            if self.in_string {
                // Copy up to the next quote or backslash at once.
                let start = i;
                while i < chunk.len() {
                    let b = chunk[i];
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        break;
                    }
                    i += 1;
                }
                let end = i.min(chunk.len());
                self.push(&chunk[start..end]);
                if i < chunk.len() {
                    // The closing quote.
                    self.in_string = false;
                    self.push(b"\"");
                    self.reading_key = false;
                    i += 1;
                    self.after_string(emit)?;
                }
                continue;
            }
            if self.in_scalar {
                let start = i;
                while i < chunk.len() && !ends_scalar(chunk[i]) {
                    i += 1;
                }
                self.push(&chunk[start..i]);
                if i < chunk.len() {
                    self.in_scalar = false;
                    self.end_scalar(emit)?;
                }
                continue;
            }
            let b = chunk[i];
            if !STRUCTURAL[usize::from(b)] {
                let start = i;
                while i < chunk.len() && !STRUCTURAL[usize::from(chunk[i])] {
                    i += 1;
                }
                let run = &chunk[start..i];
                if self.depth == 0 || (self.in_items && self.depth == 2 && !self.in_item) {
                    // Whitespace between values, or the start of a scalar.
                    let Some(first) = run.iter().position(|b| !b.is_ascii_whitespace()) else { continue };
                    i = start + first;
                    self.start_value();
                    self.in_scalar = true;
                    continue;
                }
                self.push(run);
                continue;
            }
            i += 1;
            match b {
                b'"' => {
                    if self.depth == 0 || (self.in_items && self.depth == 2 && !self.in_item) {
                        self.start_value();
                    }
                    if self.depth == 1 && self.object && self.expect_key && !self.in_item {
                        self.key.clear();
                        self.reading_key = true;
                    }
                    self.push(b"\"");
                    self.in_string = true;
                }
                b'{' | b'[' => {
                    if self.depth == 0 {
                        self.object = b == b'{';
                        self.expect_key = self.object;
                        self.items_done = false;
                    } else if self.in_items && self.depth == 2 && !self.in_item {
                        self.in_item = true;
                        self.item_scalar = false;
                    }
                    let opens_items =
                        self.depth == 1 && self.object && b == b'[' && self.last_key_is_items && !self.items_done;
                    self.push(&[b]);
                    self.depth += 1;
                    if opens_items {
                        self.in_items = true;
                        self.items_done = true;
                    }
                }
                b'}' | b']' => {
                    if self.in_items && self.depth == 2 && b == b']' && !self.in_item {
                        self.in_items = false;
                    }
                    self.push(&[b]);
                    self.depth = self.depth.saturating_sub(1);
                    if self.in_item && self.depth == 2 {
                        self.in_item = false;
                        emit(Piece::Item(&self.item))?;
                        self.item.clear();
                    } else if self.depth == 0 {
                        self.end_document(emit)?;
                    }
                }
                b',' => {
                    if !(self.in_items && self.depth == 2 && !self.in_item) {
                        self.push(b",");
                    }
                    if self.depth == 1 && self.object {
                        self.expect_key = true;
                        self.last_key_is_items = false;
                    }
                }
                _ => {
                    // ':' after a key.
                    self.push(b":");
                    if self.depth == 1 && self.object {
                        self.expect_key = false;
                    }
                }
            }
        }
        Ok(())
    }

    /// A string or scalar value starts at depth 0 or as an element of `items`.
    fn start_value(&mut self) {
        if self.depth == 0 {
            self.object = false;
            self.expect_key = false;
        } else {
            self.in_item = true;
            self.item_scalar = true;
        }
    }

    fn after_string<E>(&mut self, emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>) -> Result<(), E> {
        if self.depth == 1 && self.object && self.expect_key && !self.in_item {
            // `"items"` with its quotes.
            self.last_key_is_items = self.key == b"\"items\"";
        }
        if self.depth == 0 {
            return self.end_document(emit);
        }
        if self.in_item && self.item_scalar && self.depth == 2 {
            self.in_item = false;
            emit(Piece::Item(&self.item))?;
            self.item.clear();
        }
        Ok(())
    }

    fn end_scalar<E>(&mut self, emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>) -> Result<(), E> {
        if self.depth == 0 {
            return self.end_document(emit);
        }
        if self.in_item && self.item_scalar {
            self.in_item = false;
            emit(Piece::Item(&self.item))?;
            self.item.clear();
        }
        Ok(())
    }

    fn end_document<E>(&mut self, emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>) -> Result<(), E> {
        emit(Piece::Document(&self.doc))?;
        self.doc.clear();
        self.object = false;
        self.expect_key = false;
        self.last_key_is_items = false;
        self.in_items = false;
        self.items_done = false;
        Ok(())
    }

    /// What is left at the end: an unfinished item is put back into its
    /// document, which is handed on for the parser to refuse.
    fn finish<E>(mut self, emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>) -> Result<(), E> {
        if self.in_item && self.item_scalar && !self.in_string && self.depth == 2 {
            // A scalar element ended by the end of input.
            emit(Piece::Item(&self.item))?;
            self.item.clear();
            self.in_item = false;
        }
        if self.in_scalar && self.depth == 0 {
            return emit(Piece::Document(&self.doc));
        }
        if !self.item.is_empty() {
            let item = std::mem::take(&mut self.item);
            self.doc.extend_from_slice(&item);
        }
        if !self.doc.is_empty() {
            emit(Piece::Document(&self.doc))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str, chunk: usize) -> Vec<String> {
        let mut out = Vec::new();
        let input = std::io::BufReader::with_capacity(chunk, text.as_bytes());
        Splitter::default()
            .run(
                input,
                &mut |p| {
                    out.push(match p {
                        Piece::Item(b) => format!("item {}", String::from_utf8_lossy(b)),
                        Piece::Document(b) => format!("doc {}", String::from_utf8_lossy(b)),
                    });
                    Ok::<(), ()>(())
                },
                |_| (),
            )
            .unwrap();
        out
    }

    #[test]
    fn items_are_split_out_of_their_document_in_any_chunking() {
        let text = r#" {"apiVersion": "v1", "items": [ {"kind": "A", "s": "x\"]}, \\"}, [1], 3 ,"str", {"items": [{}]} ], "kind": "List", "more": {"items": [{"k": 1}]}}
            {"kind": "B"} 7 "top" [ {"items": [1]} ]"#;
        let expected = [
            r#"item {"kind": "A", "s": "x\"]}, \\"}"#,
            "item [1]",
            "item 3",
            r#"item "str""#,
            r#"item {"items": [{}]}"#,
            r#"doc {"apiVersion": "v1", "items": [], "kind": "List", "more": {"items": [{"k": 1}]}}"#,
            r#"doc {"kind": "B"}"#,
            "doc 7",
            r#"doc "top""#,
            r#"doc [ {"items": [1]} ]"#,
        ];
        for chunk in [1, 2, 3, 7, 64, 4096] {
            assert_eq!(pieces(text, chunk), expected, "chunks of {chunk}");
        }
    }

    #[test]
    fn only_the_first_top_level_items_array_is_split() {
        let text = r#"{"items": [{"a": 1}], "items": [{"b": 2}], "x": {"items": []}}"#;
        assert_eq!(
            pieces(text, 5),
            [r#"item {"a": 1}"#, r#"doc {"items": [], "items": [{"b": 2}], "x": {"items": []}}"#]
        );
        // A key that merely contains "items", or items that are not an array.
        let text = r#"{"xitems": [{"a": 1}], "items": 3, "k": "items"}"#;
        assert_eq!(pieces(text, 5), [format!("doc {text}")]);
    }

    #[test]
    fn unfinished_input_is_handed_on_whole() {
        assert_eq!(pieces(r#"{"kind": "A"} {"kind": "#, 4), [r#"doc {"kind": "A"}"#, r#"doc {"kind": "#]);
        assert_eq!(pieces(r#"{"items": [{"a": 1}, {"b": "#, 4), [r#"item {"a": 1}"#, r#"doc {"items": [{"b": "#]);
        assert_eq!(pieces("12", 1), ["doc 12"]);
    }
}
