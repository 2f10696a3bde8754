//! A listening socket's file (the control socket, a migration destination's
//! `unix:` socket): created mode 0600 with no moment at which it is more
//! open, never replacing a live socket or anything that is not a socket,
//! replacing a stale one, and removed when the server goes (only if it is
//! still the file this server made).
//!
//! How the mode is made safe: `bind` creates the file with `0777 & ~umask`, and
//! changing the umask around it would change it for every thread of the
//! process (and two threads doing so at once can leave it changed for good).
//! So we bind in a fresh private directory instead: `tempfile` makes a 0700
//! directory with a random name next to PATH (same filesystem), the socket is bound inside it and
//! `chmod`ed to 0600 while no other user can reach it, and only then
//! `renameat2(RENAME_NOREPLACE)` moves it to PATH. The file appears at PATH
//! already 0600, and the rename fails, rather than replaces, if anything
//! appeared at PATH meanwhile. Root can reach the file at any time, as it can
//! any file; peers are also checked by uid when they connect.
//!
//! What is at PATH before we start: nothing is fine; a socket nobody listens on
//! (connect fails with ECONNREFUSED: a VMM that died without cleaning up) is
//! replaced; a socket somebody listens on is an error; anything else is an
//! error. Between the stale check and the rename another process could bind
//! PATH; the rename then fails, so a live socket is still never replaced.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why the socket file could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A server accepts connections at the path.
    #[error("{0} is in use by a running server")]
    InUse(PathBuf),
    /// Something other than a socket is at the path.
    #[error("{0} exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    /// `lstat` of the path, or the test connect to it, failed in an unexpected way.
    #[error("checking what is at {0}")]
    Probe(PathBuf, #[source] io::Error),
    /// Making the private directory beside the path failed (no such
    /// directory, no permission).
    #[error("creating a private directory next to {0}")]
    TempDir(PathBuf, #[source] io::Error),
    /// `bind` or `listen` in the private directory failed.
    #[error("binding a socket at {0}")]
    Bind(PathBuf, #[source] io::Error),
    /// `chmod 0600` of the new socket failed.
    #[error("restricting the socket to its owner")]
    Chmod(#[source] io::Error),
    /// A dead server's socket at the path could not be removed.
    #[error("removing the stale socket {0}")]
    RemoveStale(PathBuf, #[source] io::Error),
    /// `renameat2(RENAME_NOREPLACE)` to the path failed (something appeared there meanwhile).
    #[error("moving the socket to {0}")]
    Rename(PathBuf, #[source] io::Error),
    /// The path is longer than [`MAX_PATH`] bytes.
    #[error("socket path {path} is {len} bytes long; at most {max} fit (the kernel takes 107, and the socket is first bound under a temporary name beside it)")]
    TooLong {
        /// The path asked for.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// [`MAX_PATH`].
        max: usize,
    },
}

/// Longest socket path: `sun_path` holds 107 bytes and a NUL, and the socket is
/// first bound at `<dir>/.kvmscope-XXXXXX/s`, which is longer than the path by
/// at most this much.
const TEMP_EXTRA: usize = ".kvmscope-XXXXXX/s".len();
/// Longest path `bind` accepts.
pub(crate) const MAX_PATH: usize = 107 - TEMP_EXTRA;

/// A listening socket and the file it is reachable at; dropping it removes the
/// file, unless something else has been put at that path since.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    /// Device and inode of our file, to recognise it at removal.
    identity: (u64, u64),
}

impl SocketFile {
    /// Binds a listening socket at `path`, mode 0600 (see the module docs).
    ///
    /// # Errors
    /// `InUse` if a server answers at `path`, `NotASocket` if something else is
    /// there, or the step that failed.
    pub(crate) fn bind(path: &Path) -> Result<(SocketFile, UnixListener), Error> {
        let len = path.as_os_str().len();
        if len > MAX_PATH {
            return Err(Error::TooLong {
                path: path.to_path_buf(),
                len,
                max: MAX_PATH,
            });
        }
        let stale = probe(path)?;
        let dir = private_dir(path)?;
        let temp = dir.path().join("s");
        let listener = UnixListener::bind(&temp).map_err(|e| Error::Bind(path.to_path_buf(), e))?;
        fs::set_permissions(&temp, fs::Permissions::from_mode(0o600)).map_err(Error::Chmod)?;
        // No command takes an fd: clients may send none (where the kernel
        // can refuse them; else they are taken and closed as they come).
        if !crate::scm::refuse_fds(&listener) {
            log::debug!(
                "control: this kernel cannot refuse fds on the socket (SO_PASSRIGHTS, Linux 6.16+)"
            );
        }
        if stale {
            remove_stale(path)?;
        }
        rename_noreplace(&temp, path).map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => Error::InUse(path.to_path_buf()),
            _ => Error::Rename(path.to_path_buf(), e),
        })?;
        let meta = fs::symlink_metadata(path).map_err(|e| Error::Probe(path.to_path_buf(), e))?;
        Ok((
            SocketFile {
                path: path.to_path_buf(),
                identity: (meta.dev(), meta.ino()),
            },
            listener,
        ))
    }

    /// Binds a listening socket at `path` itself, then makes it 0600, for a
    /// socket whose bound path must show in `/proc/net/unix` (`ss -xl`),
    /// where [`SocketFile::bind`]'s shows its temporary name: a migration
    /// destination's, which orchestrators and scripts wait for there. What
    /// is at `path` is checked as by `bind`; the file is as open as the
    /// umask leaves it between the bind and the `chmod` (a destination also
    /// checks each peer's uid as it accepts it).
    ///
    /// # Errors
    /// As [`SocketFile::bind`].
    pub(crate) fn bind_in_place(path: &Path) -> Result<(SocketFile, UnixListener), Error> {
        if probe(path)? {
            remove_stale(path)?;
        }
        let listener = UnixListener::bind(path).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => Error::InUse(path.to_path_buf()),
            _ => Error::Bind(path.to_path_buf(), e),
        })?;
        let meta = fs::symlink_metadata(path).map_err(|e| Error::Probe(path.to_path_buf(), e))?;
        let file = SocketFile {
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
        };
        // Dropped on an error from here: the file goes with it.
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(Error::Chmod)?;
        let _ = crate::scm::refuse_fds(&listener);
        Ok((file, listener))
    }

    /// Where the socket is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours =
            fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if ours {
            if let Err(e) = fs::remove_file(&self.path) {
                log::warn!("could not remove the socket {}: {e}", self.path.display());
            }
        }
    }
}

/// Removes the stale socket at `path` (gone meanwhile is fine).
fn remove_stale(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(Error::RemoveStale(path.to_path_buf(), e))
        }
        _ => Ok(()),
    }
}

/// What is at `path`: `Ok(false)` nothing, `Ok(true)` a stale socket.
fn probe(path: &Path) -> Result<bool, Error> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::Probe(path.to_path_buf(), e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket(path.to_path_buf()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::InUse(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(true),
        Err(e) => Err(Error::Probe(path.to_path_buf(), e)),
    }
}

/// A 0700 directory (`tempfile`'s: random name, created exclusively) beside the
/// target path, so that the rename into place stays on one filesystem;
/// removed with its content on drop.
fn private_dir(target: &Path) -> Result<tempfile::TempDir, Error> {
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(".kvmscope-")
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(|e| Error::TempDir(target.to_path_buf(), e))
}

fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let p =
                std::env::temp_dir().join(format!("kvmscope-sock-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn bind_refuses_a_path_too_long_for_the_kernel_naming_the_limit() {
        let long = std::env::temp_dir().join("x".repeat(MAX_PATH));
        match SocketFile::bind(&long) {
            Err(Error::TooLong { max, .. }) => assert_eq!(max, MAX_PATH),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bind_creates_an_owner_only_socket_and_leaves_no_temp_dir() {
        let d = Scratch::new("mode");
        let path = d.0.join("ctl.sock");
        let (_file, _listener) = SocketFile::bind(&path).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(entries(&d.0), vec!["ctl.sock"]);
        UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn bind_refuses_a_live_socket() {
        let d = Scratch::new("live");
        let path = d.0.join("ctl.sock");
        let _other = UnixListener::bind(&path).unwrap();
        assert!(matches!(SocketFile::bind(&path), Err(Error::InUse(_))));
        assert!(
            fs::symlink_metadata(&path).is_ok(),
            "the live socket is left alone"
        );
    }

    #[test]
    fn bind_replaces_a_stale_socket() {
        let d = Scratch::new("stale");
        let path = d.0.join("ctl.sock");
        drop(UnixListener::bind(&path).unwrap());
        let (_file, _listener) = SocketFile::bind(&path).unwrap();
        UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn bind_refuses_to_replace_a_regular_file() {
        let d = Scratch::new("file");
        let path = d.0.join("ctl.sock");
        fs::write(&path, b"precious").unwrap();
        assert!(matches!(SocketFile::bind(&path), Err(Error::NotASocket(_))));
        assert_eq!(fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn drop_removes_the_socket_file() {
        let d = Scratch::new("drop");
        let path = d.0.join("ctl.sock");
        drop(SocketFile::bind(&path).unwrap());
        assert!(entries(&d.0).is_empty());
    }

    #[test]
    fn drop_leaves_a_file_that_replaced_ours() {
        let d = Scratch::new("replaced");
        let path = d.0.join("ctl.sock");
        let (file, _listener) = SocketFile::bind(&path).unwrap();
        fs::remove_file(&path).unwrap();
        fs::write(&path, b"someone else's").unwrap();
        drop(file);
        assert_eq!(fs::read(&path).unwrap(), b"someone else's");
    }
}
