//! Lets any gRPC client call the plugin's Unix sockets.
//!
//! Many clients (Python grpcio, grpc-java, grpcurl) send the socket's path
//! as the HTTP/2 `:authority` of a Unix-socket call; the h2 crate under
//! tonic refuses it as a URI authority and resets the stream with
//! PROTOCOL_ERROR (hyperium/h2#487, open). On a Unix socket the authority
//! means nothing (the kubelet sends `localhost`), so the bytes a client
//! sends pass through [`AuthorityRewriter`] first, which sets every
//! `:authority` to `localhost`.
//!
//! It walks HTTP/2 frames (RFC 9113 §4) and, inside header blocks, HPACK
//! representations (RFC 7541 §6) without decoding them: strings are length
//! prefixed, so only the `:authority` value (static table index 1) is
//! replaced, with a plain `localhost`, under the same representation. Entries
//! the client adds to the dynamic table stay in the same order, so indices
//! it sends later still mean the same entries (the server's copies are only
//! smaller). Padding is dropped and a block split over CONTINUATION frames
//! is re-sent the same way. Everything else passes unchanged.

/// The client connection preface.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Frames we emit stay within the default SETTINGS_MAX_FRAME_SIZE.
const MAX_FRAME: usize = 16_384;
/// Largest header block we hold while its CONTINUATIONs arrive.
const MAX_BLOCK: usize = 1 << 20;
/// Static table index of `:authority`.
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";
/// `:authority` as a plain HPACK string (length 10, then the name).
const AUTHORITY_LITERAL: [u8; 11] = *b"\x0a:authority";

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("malformed HTTP/2 from the client: {0}")]
    Malformed(&'static str),
}

/// A header block waiting for its CONTINUATION frames.
#[derive(Debug)]
struct Pending {
    stream: [u8; 4],
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// Rewrites the client-to-server bytes of one connection.
#[derive(Debug, Default)]
pub struct AuthorityRewriter {
    preface_seen: usize,
    buffered: Vec<u8>,
    pending: Option<Pending>,
}

impl AuthorityRewriter {
    /// Takes bytes read from the client; appends what to send the server.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut input = input;
        if self.preface_seen < PREFACE_LEN {
            let n = (PREFACE_LEN - self.preface_seen).min(input.len());
            out.extend_from_slice(&input[..n]);
            self.preface_seen += n;
            input = &input[n..];
        }
        self.buffered.extend_from_slice(input);
        let mut at = 0;
        while let Some(header) = self.buffered.get(at..at + FRAME_HEADER_LEN) {
            let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let end = at + FRAME_HEADER_LEN + len;
            if self.buffered.len() < end {
                break;
            }
            let (frame_type, flags) = (header[3], header[4]);
            let stream = [header[5], header[6], header[7], header[8]];
            if frame_type == HEADERS || frame_type == CONTINUATION {
                let payload = self.buffered[at + FRAME_HEADER_LEN..end].to_vec();
                self.header_frame(frame_type, flags, stream, payload, out)?;
            } else {
                out.extend_from_slice(&self.buffered[at..end]);
            }
            at = end;
        }
        self.buffered.drain(..at);
        Ok(())
    }

    fn header_frame(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: [u8; 4],
        payload: Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        match frame_type {
            HEADERS => {
                let mut body = &payload[..];
                if flags & PADDED != 0 {
                    let (&pad, rest) = body.split_first().ok_or(RewriteError::Malformed("HEADERS padding"))?;
                    let keep =
                        rest.len().checked_sub(usize::from(pad)).ok_or(RewriteError::Malformed("HEADERS padding"))?;
                    body = &rest[..keep];
                }
                let priority = if flags & PRIORITY != 0 {
                    let p: [u8; 5] = body
                        .get(..5)
                        .and_then(|p| p.try_into().ok())
                        .ok_or(RewriteError::Malformed("HEADERS priority"))?;
                    body = &body[5..];
                    Some(p)
                } else {
                    None
                };
                let pending = Pending { stream, flags: flags & !PADDED, priority, block: body.to_vec() };
                if flags & END_HEADERS != 0 {
                    emit(&pending, out)?;
                } else {
                    self.pending = Some(pending);
                }
            }
            _ => {
                let Some(mut pending) = self.pending.take() else {
                    return Err(RewriteError::Malformed("CONTINUATION without HEADERS"));
                };
                if pending.block.len() + payload.len() > MAX_BLOCK {
                    return Err(RewriteError::Malformed("header block too large"));
                }
                pending.block.extend_from_slice(&payload);
                if flags & END_HEADERS != 0 {
                    emit(&pending, out)?;
                } else {
                    self.pending = Some(pending);
                }
            }
        }
        Ok(())
    }
}

/// Sends a whole header block as HEADERS (+ CONTINUATION) frames.
fn emit(pending: &Pending, out: &mut Vec<u8>) -> Result<(), RewriteError> {
    let block = rewrite_block(&pending.block)?;
    let mut first = Vec::with_capacity(block.len() + 5);
    if let Some(p) = pending.priority {
        first.extend_from_slice(&p);
    }
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = block.split_at(block.len().min(room));
    first.extend_from_slice(head);
    let last = rest.is_empty();
    let flags = if last { pending.flags | END_HEADERS } else { pending.flags & !END_HEADERS };
    frame(out, HEADERS, flags, pending.stream, &first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        frame(out, CONTINUATION, if tail.is_empty() { END_HEADERS } else { 0 }, pending.stream, chunk);
        rest = tail;
    }
    Ok(())
}

fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, frame_type, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

/// The header block with every `:authority` value set to `localhost`.
fn rewrite_block(block: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        let start = at;
        if first & 0x80 != 0 {
            at = integer(block, at, 7)?.1; // indexed field
        } else if first & 0xe0 == 0x20 {
            at = integer(block, at, 5)?.1; // dynamic table size update
        } else {
            let prefix = if first & 0x40 != 0 { 6 } else { 4 }; // literal forms
            let (index, name_end) = integer(block, at, prefix)?;
            let value_start = if index == 0 { string(block, name_end)? } else { name_end };
            let value_end = string(block, value_start)?;
            // By static index, or by name as a plain (not Huffman) string,
            // as grpc-core sends it.
            let named = index == 0 && block.get(name_end..value_start) == Some(&AUTHORITY_LITERAL[..]);
            if index == AUTHORITY_INDEX || named {
                out.extend_from_slice(&block[start..value_start]);
                out.push(LOCALHOST.len() as u8);
                out.extend_from_slice(LOCALHOST);
                at = value_end;
                continue;
            }
            at = value_end;
        }
        out.extend_from_slice(&block[start..at]);
    }
    Ok(out)
}

/// An HPACK integer with an `n`-bit prefix at `at`: (value, end).
fn integer(block: &[u8], at: usize, n: u32) -> Result<(u64, usize), RewriteError> {
    let truncated = RewriteError::Malformed("truncated HPACK integer");
    let mask = (1u8 << n) - 1;
    let mut value = u64::from(*block.get(at).ok_or(truncated.clone())? & mask);
    let mut at = at + 1;
    if value < u64::from(mask) {
        return Ok((value, at));
    }
    let mut shift = 0;
    loop {
        let b = *block.get(at).ok_or(truncated.clone())?;
        at += 1;
        if shift > 56 {
            return Err(RewriteError::Malformed("HPACK integer too large"));
        }
        value += u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok((value, at));
        }
    }
}

/// The end of the HPACK string at `at`.
fn string(block: &[u8], at: usize) -> Result<usize, RewriteError> {
    let (len, start) = integer(block, at, 7)?;
    let end = usize::try_from(len).ok().and_then(|l| start.checked_add(l)).filter(|&e| e <= block.len());
    end.ok_or(RewriteError::Malformed("truncated HPACK string"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame_bytes(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, frame_type, flags, stream.to_be_bytes(), payload);
        out
    }

    /// `:method POST` (indexed 3), `:authority` literal with incremental
    /// indexing of `value`, `:path` literal without indexing.
    fn block(authority_value: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x41, authority_value.len() as u8];
        b.extend_from_slice(authority_value);
        b.extend_from_slice(&[0x04, 0x05]);
        b.extend_from_slice(b"/a/bc");
        b
    }

    fn rewritten(input: &[u8]) -> Vec<u8> {
        let mut r = AuthorityRewriter::default();
        let mut out = Vec::new();
        // Byte by byte: frames split anywhere still come out whole.
        for b in input {
            r.feed(std::slice::from_ref(b), &mut out).unwrap();
        }
        out
    }

    #[test]
    fn the_authority_becomes_localhost_and_the_rest_passes() {
        let settings = frame_bytes(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let headers = frame_bytes(HEADERS, END_HEADERS, 1, &block(b"/var/lib/kubelet/plugins/x/dra.sock"));
        let data = frame_bytes(0x0, 0x1, 1, b"\0\0\0\0\0");
        let input = [PREFACE, &settings, &headers, &data].concat();
        let expected =
            [PREFACE, &settings, &frame_bytes(HEADERS, END_HEADERS, 1, &block(b"localhost")), &data].concat();
        assert_eq!(rewritten(&input), expected);
    }

    #[test]
    fn padding_priority_and_continuations_are_handled() {
        let mut payload = vec![3]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        let b = block(b"%2Ftmp%2Fs.sock");
        payload.extend_from_slice(&b[..4]);
        payload.extend_from_slice(&[0, 0, 0]);
        let first = frame_bytes(HEADERS, PADDED | PRIORITY, 3, &payload);
        let cont = frame_bytes(CONTINUATION, END_HEADERS, 3, &b[4..]);
        let out = rewritten(&[PREFACE, &first, &cont].concat());
        let mut want = vec![0, 0, 0, 0, 16];
        want.extend_from_slice(&block(b"localhost"));
        assert_eq!(out, [PREFACE, &frame_bytes(HEADERS, PRIORITY | END_HEADERS, 3, &want)].concat());
    }

    #[test]
    fn long_and_indexed_names_and_huge_blocks() {
        // A 200-byte authority value (a multi-byte length) is replaced.
        let long = vec![b'x'; 200];
        let mut b = vec![0x41, 0x7f, (200 - 127) as u8];
        b.extend_from_slice(&long);
        let out = rewrite_block(&b).unwrap();
        assert_eq!(out, [&[0x41, 9][..], LOCALHOST].concat());
        // The name spelled out, as grpc-core sends it (a capture of grpcio).
        let mut named = vec![0x40];
        named.extend_from_slice(&AUTHORITY_LITERAL);
        named.extend_from_slice(b"\x0etmp%2Fcap.sock");
        let mut expected = vec![0x40];
        expected.extend_from_slice(&AUTHORITY_LITERAL);
        expected.push(9);
        expected.extend_from_slice(LOCALHOST);
        assert_eq!(rewrite_block(&named).unwrap(), expected);
        // Never-indexed form (0x11) keeps its representation.
        assert_eq!(rewrite_block(&[0x11, 1, b'a']).unwrap(), [&[0x11, 9][..], LOCALHOST].concat());
        // A block over one frame goes out as HEADERS + CONTINUATION.
        let mut big = Vec::new();
        for _ in 0..2000 {
            big.extend_from_slice(&[0x40, 3, b'k', b'e', b'y', 5, b'v', b'a', b'l', b'u', b'e']);
        }
        let out = rewritten(&[PREFACE, &frame_bytes(HEADERS, END_HEADERS, 5, &big)].concat());
        assert_eq!(out[PREFACE.len() + 3], HEADERS);
        assert_eq!(out[PREFACE.len() + 4] & END_HEADERS, 0);
        let second = PREFACE.len() + FRAME_HEADER_LEN + MAX_FRAME;
        assert_eq!((out[second + 3], out[second + 4]), (CONTINUATION, END_HEADERS));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let mut r = AuthorityRewriter::default();
        let mut out = Vec::new();
        r.feed(PREFACE, &mut out).unwrap();
        let bad = frame_bytes(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2]);
        assert!(r.feed(&bad, &mut out).is_err());
        let mut r = AuthorityRewriter::default();
        r.feed(PREFACE, &mut out).unwrap();
        assert!(r.feed(&frame_bytes(CONTINUATION, END_HEADERS, 1, &[0x82]), &mut out).is_err());
        for cut in 0..12 {
            let _ = rewrite_block(&[0x41, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..cut]);
        }
        assert!(rewrite_block(&[0x41, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
    }
}
