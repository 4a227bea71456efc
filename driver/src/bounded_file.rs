//! Reading files whose kind and size we do not control: state a crash or a
//! person may have damaged, and inputs from the node.
//!
//! A plain `fs::read` of a path follows symlinks, blocks forever on a FIFO
//! and reads `/dev/zero` until memory runs out. Here every read opens with
//! `O_NONBLOCK` (a FIFO opens at once), checks with `fstat` on the open
//! file that it is a regular file, and reads at most `max_len` bytes: a
//! larger file is refused, not truncated. State files are also opened
//! with `O_NOFOLLOW` ([`Links::Refuse`]), and a state directory is walked
//! through [`Dir`], whose every step refuses a symlink, so nothing is read,
//! written or removed through one.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Whether the last component of a path may be a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// State files: a symlink is refused (`O_NOFOLLOW`).
    Refuse,
    /// Inputs a person or Kubernetes provides (a ConfigMap's files are
    /// symlinks): followed, but what they lead to must still be a regular
    /// file within the size limit.
    Follow,
}

/// Why a file was not read, and which.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct ReadError {
    pub path: PathBuf,
    pub problem: ReadProblem,
}

/// What was wrong with the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadProblem {
    #[error("cannot open: {0}")]
    Open(io::Error),
    #[error("is a symbolic link, which is not followed here; only a regular file is read")]
    Symlink,
    #[error("is a {0}; only a regular file is read")]
    NotRegular(&'static str),
    #[error("holds more than {0} bytes, the most such a file may hold")]
    TooLarge(u64),
    #[error("reading: {0}")]
    Read(io::Error),
}

impl ReadError {
    fn new(path: &Path, problem: ReadProblem) -> Self {
        Self { path: path.to_path_buf(), problem }
    }

    /// Whether the file does not exist (often not an error for callers).
    pub fn is_not_found(&self) -> bool {
        matches!(&self.problem, ReadProblem::Open(error) if error.kind() == io::ErrorKind::NotFound)
    }
}

/// Reads `path` whole if it is a regular file of at most `max_len` bytes.
pub fn read(path: &Path, max_len: u64, links: Links) -> Result<Vec<u8>, ReadError> {
    let fd = open_file(rustix::fs::CWD, path, links).map_err(|error| open_error(path, error))?;
    read_open(fd, path, max_len)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path, max_len: u64, links: Links) -> Result<String, ReadError> {
    let bytes = read(path, max_len, links)?;
    String::from_utf8(bytes).map_err(|e| {
        ReadError::new(path, ReadProblem::Read(io::Error::new(io::ErrorKind::InvalidData, e.utf8_error())))
    })
}

fn open_file(dir: impl AsFd, name: impl rustix::path::Arg, links: Links) -> io::Result<OwnedFd> {
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    if links == Links::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    Ok(rustix::fs::openat(dir, name, flags, Mode::empty())?)
}

/// `O_NOFOLLOW` on a symlink fails with `ELOOP`: say what it means.
fn open_error(path: &Path, error: io::Error) -> ReadError {
    if error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
        ReadError::new(path, ReadProblem::Symlink)
    } else {
        ReadError::new(path, ReadProblem::Open(error))
    }
}

fn read_open(fd: OwnedFd, path: &Path, max_len: u64) -> Result<Vec<u8>, ReadError> {
    let read_error = |error: io::Error| ReadError::new(path, ReadProblem::Read(error));
    let stat = rustix::fs::fstat(&fd).map_err(|e| read_error(e.into()))?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind != FileType::RegularFile {
        return Err(ReadError::new(path, ReadProblem::NotRegular(kind_name(kind))));
    }
    let too_large = || ReadError::new(path, ReadProblem::TooLarge(max_len));
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > max_len {
        return Err(too_large());
    }
    // The size may change under us, and /proc files report 0: the limit
    // is enforced on what is read, not on what fstat said.
    let capacity = usize::try_from(size.min(max_len)).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    File::from(fd).take(max_len.saturating_add(1)).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > max_len {
        return Err(too_large());
    }
    Ok(bytes)
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO (named pipe)",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "file of unknown kind",
    }
}

/// Whether `name` names an entry of a directory and nothing else: not
/// empty, no `/`, not `.` or `..`, no NUL.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// An open directory whose entries are reached without following a
/// symlink: a symlinked entry (file or directory) is refused, so a forged
/// link cannot lead a read, write or removal out of it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens `path`, refusing it if its last component is a symlink (the
    /// components above it are the caller's own configuration).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::openat(rustix::fs::CWD, path, dir_flags(), Mode::empty())?;
        Ok(Self { fd, path: path.to_path_buf() })
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The subdirectory `name`, refused if it is a symlink or not a
    /// directory.
    pub fn subdir(&self, name: &str) -> io::Result<Dir> {
        plain(name)?;
        let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty())?;
        Ok(Self { fd, path: self.path.join(name) })
    }

    /// The subdirectory `name`, made with `mode` when missing; an existing
    /// symlink or non-directory of that name is refused.
    pub fn make_subdir(&self, name: &str, mode: u32) -> io::Result<Dir> {
        plain(name)?;
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => self.subdir(name),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the character device `name` (major, minor) with exactly
    /// `mode` (whatever the umask); fails if an entry of that name exists.
    pub fn make_char_device(&self, name: &str, major: u32, minor: u32, mode: u32) -> io::Result<()> {
        plain(name)?;
        let mode = Mode::from_raw_mode(mode);
        rustix::fs::mknodat(&self.fd, name, FileType::CharacterDevice, mode, rustix::fs::makedev(major, minor))?;
        // The umask narrowed it. Not following a symlink needs fchmodat2
        // (Linux 6.6); on older kernels the node just made is changed by
        // name, in a directory reached without following one.
        match rustix::fs::chmodat(&self.fd, name, mode, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOTSUP | rustix::io::Errno::NOSYS) => {
                rustix::fs::chmodat(&self.fd, name, mode, AtFlags::empty())?
            }
            other => other?,
        }
        Ok(())
    }

    /// Reads the regular file `name` (not a symlink), at most `max_len`
    /// bytes.
    pub fn read(&self, name: &str, max_len: u64) -> Result<Vec<u8>, ReadError> {
        let path = self.path.join(name);
        plain(name).map_err(|error| ReadError::new(&path, ReadProblem::Open(error)))?;
        let fd = open_file(&self.fd, name, Links::Refuse).map_err(|error| open_error(&path, error))?;
        read_open(fd, &path, max_len)
    }

    /// Opens the regular file `name` for appending, creating it with `mode`
    /// when missing (a log a child process writes): a symlink is refused
    /// (`O_NOFOLLOW`), and so is anything but a regular file (a FIFO opens
    /// at once, `O_NONBLOCK`, and is refused).
    pub fn open_append(&self, name: &str, mode: u32) -> io::Result<File> {
        plain(name)?;
        let flags =
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let path = self.path.join(name);
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode)).map_err(|e| match e {
            rustix::io::Errno::LOOP => {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{} {}", path.display(), ReadProblem::Symlink))
            }
            e => io::Error::from(e),
        })?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
        if kind != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a {}; only a regular file is written", path.display(), kind_name(kind)),
            ));
        }
        Ok(File::from(fd))
    }

    /// Removes the entry `name` (a symlink itself, never what it names);
    /// whether there was one.
    pub fn remove_file(&self, name: &str) -> io::Result<bool> {
        plain(name)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The entry `name`'s own status (a symlink's, never what it names);
    /// `None` when there is none.
    pub fn entry_stat(&self, name: &str) -> io::Result<Option<rustix::fs::Stat>> {
        plain(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// What kind of entry `name` is, without following it; `None` when
    /// there is none.
    pub fn entry_kind(&self, name: &str) -> io::Result<Option<FileType>> {
        plain(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn plain(name: &str) -> io::Result<()> {
    if is_plain_name(name) {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a plain file name")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn fifo(path: &Path) {
        rustix::fs::mknodat(rustix::fs::CWD, path, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
    }

    #[test]
    fn a_regular_file_within_the_limit_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a");
        std::fs::write(&file, b"hello").unwrap();
        assert_eq!(read(&file, 5, Links::Refuse).unwrap(), b"hello");
        assert_eq!(read_to_string(&file, 5, Links::Follow).unwrap(), "hello");
    }

    #[test]
    fn a_larger_file_is_refused_not_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a");
        std::fs::write(&file, b"hello!").unwrap();
        let error = read(&file, 5, Links::Refuse).unwrap_err();
        assert!(matches!(error.problem, ReadProblem::TooLarge(5)), "{error}");
        assert!(error.to_string().contains("more than 5 bytes"), "{error}");
    }

    /// /proc files report size 0: the limit holds on what is read.
    #[test]
    fn the_limit_holds_when_the_size_is_not_known() {
        let error = read(Path::new("/proc/self/status"), 8, Links::Follow).unwrap_err();
        assert!(matches!(error.problem, ReadProblem::TooLarge(_)), "{error}");
        assert!(!read(Path::new("/proc/self/status"), 1 << 20, Links::Follow).unwrap().is_empty());
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("fifo");
        fifo(&pipe);
        for (path, found) in [
            (Path::new("/dev/zero"), "character device"),
            (pipe.as_path(), "FIFO (named pipe)"),
            (dir.path(), "directory"),
        ] {
            let error = read(path, 1 << 20, Links::Follow).unwrap_err();
            assert!(matches!(error.problem, ReadProblem::NotRegular(f) if f == found), "{error}");
        }
    }

    #[test]
    fn symlinks_are_refused_or_followed_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let pipe = dir.path().join("fifo");
        fifo(&pipe);
        for (name, target) in [("to-file", file.as_path()), ("to-zero", Path::new("/dev/zero")), ("to-fifo", &pipe)] {
            let link = dir.path().join(name);
            symlink(target, &link).unwrap();
            let error = read(&link, 1 << 20, Links::Refuse).unwrap_err();
            assert!(matches!(error.problem, ReadProblem::Symlink), "{name}: {error}");
            assert!(error.to_string().contains("is a symbolic link"), "{error}");
        }
        assert_eq!(read(&dir.path().join("to-file"), 1, Links::Follow).unwrap(), b"x");
        let error = read(&dir.path().join("to-zero"), 1 << 20, Links::Follow).unwrap_err();
        assert!(matches!(error.problem, ReadProblem::NotRegular(_)), "{error}");
    }

    #[test]
    fn a_missing_file_says_so() {
        let error = read(Path::new("/nonexistent/file"), 1, Links::Refuse).unwrap_err();
        assert!(error.is_not_found(), "{error}");
    }

    #[test]
    fn plain_names() {
        for good in ["a.json", ".a.json.1-0.tmp", "k8s.gpu.nvidia.com-claim_u.json"] {
            assert!(is_plain_name(good), "{good}");
        }
        for bad in ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\0b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_dir_never_steps_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("file"), b"keep").unwrap();
        let state = tmp.path().join("state");
        std::fs::create_dir_all(state.join("real")).unwrap();
        std::fs::write(state.join("real/file"), b"ours").unwrap();
        symlink(&outside, state.join("linked-dir")).unwrap();
        symlink(outside.join("file"), state.join("linked-file")).unwrap();
        symlink(&outside, tmp.path().join("state-link")).unwrap();

        assert!(Dir::open(&tmp.path().join("state-link")).is_err(), "the directory itself may not be a link");
        let dir = Dir::open(&state).unwrap();
        assert_eq!(dir.subdir("real").unwrap().read("file", 4).unwrap(), b"ours");
        // O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR (or ELOOP).
        assert!(dir.subdir("linked-dir").is_err());
        assert!(matches!(dir.read("linked-file", 4).unwrap_err().problem, ReadProblem::Symlink));
        assert!(dir.subdir("../outside").is_err() && dir.read("../outside/file", 4).is_err());
        assert_eq!(dir.entry_kind("linked-dir").unwrap(), Some(FileType::Symlink));
        assert_eq!(dir.entry_kind("none").unwrap(), None);
        assert!(dir.remove_file("linked-file").unwrap());
        assert!(!dir.remove_file("linked-file").unwrap());
        assert!(dir.remove_file("../outside/file").is_err());
        assert_eq!(std::fs::read(outside.join("file")).unwrap(), b"keep", "the link went, not its target");
    }

    #[test]
    fn a_file_is_appended_to_but_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        symlink(&target, tmp.path().join("link")).unwrap();
        fifo(&tmp.path().join("fifo"));
        let dir = Dir::open(tmp.path()).unwrap();
        use std::io::Write as _;
        dir.open_append("log", 0o600).unwrap().write_all(b"a").unwrap();
        dir.open_append("log", 0o600).unwrap().write_all(b"b").unwrap();
        assert_eq!(std::fs::read(tmp.path().join("log")).unwrap(), b"ab");
        let error = dir.open_append("link", 0o600).unwrap_err();
        assert!(error.to_string().contains("is a symbolic link"), "{error}");
        assert!(std::fs::symlink_metadata(&target).is_err(), "nothing created through the link");
        assert!(dir.open_append("fifo", 0o600).is_err(), "no hang on a FIFO");
        assert!(dir.open_append("../x", 0o600).is_err());
    }
}
