//! Reads `ld.so.cache`, the dynamic linker's index of libraries, the way
//! the NVIDIA Container Toolkit finds a driver's libraries.
//!
//! glibc's format (`sysdeps/generic/dl-cache.h`): since 2.32 the file holds
//! only the "new" format; older files put an "old" table (`ld.so-1.7.0`)
//! first and the new one after it, aligned. The new format is a 48-byte
//! header (`glibc-ld.so.cache1.1`, `nlibs`, `len_strings`, flags, padding,
//! extension offset, three unused words), `nlibs` 24-byte entries (`flags:
//! i32, key: u32, value: u32, osversion: u32, hwcap: u64`) and a string
//! table; `key` (the soname) and `value` (the path) are offsets from the
//! start of the new header. Everything is bounds-checked: a truncated or
//! hostile file gives an error, never a panic.

use std::path::Path;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const NEW_HEADER_LEN: usize = 48;
const NEW_ENTRY_LEN: usize = 24;
const OLD_ENTRY_LEN: usize = 12;
/// `FLAG_ELF_LIBC6`: the entry is a glibc ELF library.
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
/// `FLAG_X8664_LIB64`.
pub const FLAG_X86_64: i32 = 0x0300;
/// `FLAG_AARCH64_LIB64`.
pub const FLAG_AARCH64: i32 = 0x0a00;

/// The architecture flag of the machine this runs on.
pub fn native_arch() -> i32 {
    if cfg!(target_arch = "aarch64") { FLAG_AARCH64 } else { FLAG_X86_64 }
}

/// One library the cache knows: its soname and where it is (a path as the
/// cache's root sees it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub soname: String,
    pub path: String,
    /// glibc's flags word: ELF type and architecture.
    pub flags: i32,
}

impl CacheEntry {
    /// A glibc ELF library of architecture `arch` (see [`native_arch`]).
    pub fn is_for(&self, arch: i32) -> bool {
        self.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6 && self.flags & FLAG_REQUIRED_MASK == arch
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LdCacheError {
    #[error("not an ld.so.cache: no glibc-ld.so.cache1.1 header")]
    NoNewFormat,
    #[error("ld.so.cache is truncated: {0}")]
    Truncated(&'static str),
}

/// Parses a cache file's bytes.
pub fn parse(bytes: &[u8]) -> Result<Vec<CacheEntry>, LdCacheError> {
    let start = new_format_start(bytes)?;
    let table = bytes.get(start..).ok_or(LdCacheError::Truncated("header"))?;
    if table.len() < NEW_HEADER_LEN {
        return Err(LdCacheError::Truncated("header"));
    }
    let nlibs = read_u32(table, NEW_MAGIC.len()).ok_or(LdCacheError::Truncated("header"))? as usize;
    let entries_len = nlibs.checked_mul(NEW_ENTRY_LEN).ok_or(LdCacheError::Truncated("entries"))?;
    if NEW_HEADER_LEN.checked_add(entries_len).is_none_or(|end| end > table.len()) {
        return Err(LdCacheError::Truncated("entries"));
    }
    let mut out = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let at = NEW_HEADER_LEN + i * NEW_ENTRY_LEN;
        let flags = read_u32(table, at).ok_or(LdCacheError::Truncated("entries"))? as i32;
        let key = read_u32(table, at + 4).ok_or(LdCacheError::Truncated("entries"))? as usize;
        let value = read_u32(table, at + 8).ok_or(LdCacheError::Truncated("entries"))? as usize;
        let (Some(soname), Some(path)) = (c_string(table, key), c_string(table, value)) else {
            return Err(LdCacheError::Truncated("strings"));
        };
        out.push(CacheEntry { soname, path, flags });
    }
    Ok(out)
}

/// The largest cache read: a host with thousands of libraries has one of
/// a few MiB.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads and parses `<root>/etc/ld.so.cache`: a regular file of at most
/// [`MAX_FILE_BYTES`], not a symlink (an absolute link would lead out of
/// the driver root to the plugin's own cache). The driver root's libraries
/// may be symlinks: they are mounted, not read.
pub fn read(root: &Path) -> Result<Result<Vec<CacheEntry>, LdCacheError>, crate::bounded_file::ReadError> {
    let bytes =
        crate::bounded_file::read(&root.join("etc/ld.so.cache"), MAX_FILE_BYTES, crate::bounded_file::Links::Refuse)?;
    Ok(parse(&bytes))
}

/// Where the new-format table starts: at 0, or after an old-format table
/// (aligned to 8 bytes, as glibc writes it).
fn new_format_start(bytes: &[u8]) -> Result<usize, LdCacheError> {
    if bytes.starts_with(NEW_MAGIC) {
        return Ok(0);
    }
    if !bytes.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::NoNewFormat);
    }
    // Old header: the 11-byte magic padded to 12, then nlibs.
    let nlibs = read_u32(bytes, 12).ok_or(LdCacheError::Truncated("old header"))? as usize;
    let end = nlibs
        .checked_mul(OLD_ENTRY_LEN)
        .and_then(|n| n.checked_add(16))
        .ok_or(LdCacheError::Truncated("old entries"))?;
    let aligned = end.checked_next_multiple_of(8).ok_or(LdCacheError::Truncated("old entries"))?;
    match bytes.get(aligned..) {
        Some(rest) if rest.starts_with(NEW_MAGIC) => Ok(aligned),
        _ => Err(LdCacheError::NoNewFormat),
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_ne_bytes(b))
}

fn c_string(bytes: &[u8], at: usize) -> Option<String> {
    let rest = bytes.get(at..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    String::from_utf8(rest.get(..len)?.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new-format cache with these (flags, soname, path) entries.
    pub(crate) fn cache(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let strings_at = NEW_HEADER_LEN + entries.len() * NEW_ENTRY_LEN;
        let mut strings = Vec::new();
        let mut table = Vec::new();
        for (flags, key, value) in entries {
            let k = strings_at + strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let v = strings_at + strings.len();
            strings.extend_from_slice(value.as_bytes());
            strings.push(0);
            table.extend_from_slice(&flags.to_ne_bytes());
            table.extend_from_slice(&(k as u32).to_ne_bytes());
            table.extend_from_slice(&(v as u32).to_ne_bytes());
            table.extend_from_slice(&0u32.to_ne_bytes());
            table.extend_from_slice(&0u64.to_ne_bytes());
        }
        let mut out = NEW_MAGIC.to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_ne_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_ne_bytes());
        out.resize(NEW_HEADER_LEN, 0);
        out.extend(table);
        out.extend(strings);
        out
    }

    #[test]
    fn entries_are_read_with_their_architecture() {
        let bytes = cache(&[
            (FLAG_ELF_LIBC6 | FLAG_X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            (FLAG_ELF_LIBC6, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
        ]);
        let entries = parse(&bytes).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].path, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        assert!(entries[0].is_for(FLAG_X86_64) && !entries[1].is_for(FLAG_X86_64));
    }

    #[test]
    fn an_old_table_before_the_new_one_is_skipped() {
        let mut bytes = OLD_MAGIC.to_vec();
        bytes.push(0);
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&[0; OLD_ENTRY_LEN]);
        bytes.resize(32, 0);
        let new = cache(&[(FLAG_ELF_LIBC6 | FLAG_X86_64, "libnvidia-ml.so.1", "/lib/libnvidia-ml.so.1")]);
        // Offsets in the new table are relative to its own start.
        bytes.extend(new);
        assert_eq!(parse(&bytes).unwrap()[0].soname, "libnvidia-ml.so.1");
    }

    #[test]
    fn hostile_files_are_errors() {
        assert_eq!(parse(b""), Err(LdCacheError::NoNewFormat));
        assert_eq!(parse(b"garbage"), Err(LdCacheError::NoNewFormat));
        let mut huge = NEW_MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_ne_bytes());
        huge.resize(NEW_HEADER_LEN, 0);
        assert_eq!(parse(&huge), Err(LdCacheError::Truncated("entries")));
        let mut bad_offset = cache(&[(3, "a", "b")]);
        bad_offset[NEW_HEADER_LEN + 4..NEW_HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(parse(&bad_offset), Err(LdCacheError::Truncated("strings")));
        let mut old = OLD_MAGIC.to_vec();
        old.push(0);
        old.extend_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse(&old).is_err());
        for cut in 0..cache(&[(3, "libx.so.1", "/x")]).len() {
            let _ = parse(&cache(&[(3, "libx.so.1", "/x")])[..cut]);
        }
    }
}
