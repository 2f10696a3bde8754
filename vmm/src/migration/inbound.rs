//! The destination's end of a stream: the listener that waits for its one
//! source ([`Listener`]), and reads from it ([`Watched`]) that give up when
//! the source has sent nothing for the idle deadline, when a part with a
//! whole deadline is late, or when the destination is told to stop.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transport::{Conn, Error, Uri, TICK};
use crate::socket_file::SocketFile;
use crate::units::format_duration;

/// Says why the destination must stop (`signal 15`, `quit`), or `None` to go on.
pub(crate) type Stop = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Why a watched read gave up, carried inside the `io::Error` it returns.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Halt {
    /// No byte came for the idle deadline.
    #[error("the source sent nothing for {} (the idle deadline, --incoming-idle-timeout)", format_duration(*.0))]
    Idle(Duration),
    /// The part of the stream with a whole deadline (what, limit) did not arrive in time.
    #[error("the source did not send {0} within {limit} of its header", limit = format_duration(*.1))]
    Late(&'static str, Duration),
    /// The destination was told to stop (by whom).
    #[error("stopped by {0}")]
    Stopped(String),
}

/// The halt inside an I/O error from a [`Watched`] read, if it is one.
pub(crate) fn halt_of(e: &std::io::Error) -> Option<&Halt> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Halt>())
}

/// The destination's end of the stream: bytes the handshake already read
/// come first; then reads from the connection that give up as [`Halt`] says.
pub(crate) struct Watched {
    conn: Conn,
    early: Vec<u8>,
    idle: Duration,
    /// A whole deadline for what is read now (the config), with its name.
    deadline: Option<(Instant, &'static str, Duration)>,
    stop: Stop,
    /// When the stop and the whole deadline were last looked at: a source
    /// that always has bytes ready never makes a read wait, so they are
    /// looked at every [`TICK`] between reads too.
    checked: Instant,
}

impl Watched {
    /// Watches `conn` (blocking reads are set to wake every [`TICK`]); `early`
    /// is what was read from it before.
    ///
    /// # Errors
    /// The socket options could not be set.
    pub(crate) fn new(
        conn: Conn,
        early: &[u8],
        idle: Duration,
        stop: Stop,
    ) -> std::io::Result<Self> {
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(TICK))?;
        // Replies are a few bytes; a source that reads none for this long is gone.
        conn.set_write_timeout(Some(idle))?;
        Ok(Watched {
            conn,
            early: early.to_vec(),
            idle,
            deadline: None,
            stop,
            checked: Instant::now(),
        })
    }

    /// Until cleared, reads fail once `limit` from `since` has passed
    /// ([`Halt::Late`], naming `what`).
    pub(crate) fn set_deadline(&mut self, since: Instant, limit: Duration, what: &'static str) {
        self.deadline = Some((since + limit, what, limit));
    }

    /// Ends the whole deadline: from now on only the idle one applies.
    pub(crate) fn clear_deadline(&mut self) {
        self.deadline = None;
    }

    /// What says whether the destination must stop.
    pub(crate) fn stop(&self) -> Stop {
        self.stop.clone()
    }

    /// A stop asked for, or the whole deadline passed.
    fn halted(&mut self, now: Instant) -> Option<Halt> {
        self.checked = now;
        if let Some(why) = (self.stop)() {
            return Some(Halt::Stopped(why));
        }
        match self.deadline {
            Some((at, what, limit)) if now >= at => Some(Halt::Late(what, limit)),
            _ => None,
        }
    }

    fn check(&mut self, waiting_since: Instant) -> Option<Halt> {
        let now = Instant::now();
        self.halted(now).or_else(|| {
            (now.duration_since(waiting_since) >= self.idle).then_some(Halt::Idle(self.idle))
        })
    }
}

/// The error a watched read gives up with (not `Interrupted`: `read_exact`
/// would retry that).
fn halt_error(halt: Halt) -> std::io::Error {
    let kind = match halt {
        Halt::Stopped(_) => std::io::ErrorKind::Other,
        _ => std::io::ErrorKind::TimedOut,
    };
    std::io::Error::new(kind, halt)
}

impl Read for Watched {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.early.is_empty() {
            let n = buf.len().min(self.early.len());
            buf[..n].copy_from_slice(&self.early[..n]);
            self.early.drain(..n);
            return Ok(n);
        }
        let since = Instant::now();
        if since.duration_since(self.checked) >= TICK {
            if let Some(halt) = self.halted(since) {
                return Err(halt_error(halt));
            }
        }
        loop {
            match self.conn.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    if let Some(halt) = self.check(since) {
                        return Err(halt_error(halt));
                    }
                }
                other => return other,
            }
        }
    }
}

impl Write for Watched {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.conn.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A destination waiting for its one source.
pub(crate) enum Listener {
    /// The socket file is removed when the listener goes (if it is still
    /// the one this listener made).
    Unix(UnixListener, SocketFile),
    /// Listening on TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Listens at `uri`. A unix socket file is checked as the control
    /// socket's is ([`SocketFile`]): a socket left by a dead process is
    /// replaced; a live one, or anything that is not a socket, is refused.
    /// It is bound at its path (`SocketFile::bind_in_place`), which
    /// `/proc/net/unix` then shows: whoever starts the source waits there.
    ///
    /// # Errors
    /// `Listen` or `SocketFile` with the cause.
    pub(crate) fn bind(uri: &Uri) -> Result<Listener, Error> {
        match uri {
            Uri::Unix(path) => {
                // Whoever sends a guest here runs it as this VMM's user: the
                // socket is this user's (0600), and each peer's uid is
                // checked on accept too. It refuses fds where the kernel
                // can: the stream carries none.
                let (file, l) = SocketFile::bind_in_place(path)
                    .map_err(|e| Error::SocketFile(uri.to_string(), e))?;
                Ok(Listener::Unix(l, file))
            }
            Uri::Tcp(addr) => TcpListener::bind(addr.as_str())
                .map(Listener::Tcp)
                .map_err(|e| Error::Listen(uri.to_string(), e)),
        }
    }

    /// The URI as error messages name it.
    fn name(&self) -> String {
        match self {
            Listener::Unix(_, f) => format!("unix:{}", f.path().display()),
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "tcp".to_string(), |a| format!("tcp:{a}")),
        }
    }

    /// Makes [`try_accept`](Listener::try_accept) return at once when no peer waits.
    ///
    /// # Errors
    /// `Listen` when the flag could not be set.
    pub(crate) fn set_nonblocking(&self) -> Result<(), Error> {
        match self {
            Listener::Unix(l, _) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
        .map_err(|e| Error::Listen(self.name(), e))
    }

    /// Takes one waiting connection, nonblocking; `None` when none waits (or
    /// the peer left before it was taken).
    ///
    /// # Errors
    /// `Accept` when accepting failed for another reason (out of fds).
    pub(crate) fn try_accept(&self) -> Result<Option<Conn>, Error> {
        let accepted = match self {
            Listener::Unix(l, file) => loop {
                match l.accept() {
                    Ok((s, _)) => match crate::scm::peer_uid(&s) {
                        Ok(uid) if may_send(uid, rustix::process::geteuid().as_raw()) => {
                            break Ok(Conn::from(s));
                        }
                        // Closed; the next waiting peer is looked at.
                        peer => refused(file.path(), peer),
                    },
                    Err(e) => break Err(e),
                }
            },
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::from(s)
            }),
        };
        match accepted {
            Ok(conn) => conn
                .set_nonblocking(true)
                .map(|()| Some(conn))
                .map_err(|e| Error::Accept(self.name(), e)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(Error::Accept(self.name(), e)),
        }
    }
}

/// Says that a peer (its uid, or why it is unknown) was refused: the first
/// time and every thousandth after, so that one connecting in a loop does
/// not fill the log.
fn refused(path: &std::path::Path, peer: std::io::Result<u32>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    let n = REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    let who = peer.map_or_else(
        |e| format!("a peer whose credentials are unreadable ({e})"),
        |uid| format!("uid {uid}"),
    );
    let said = format!(
        "migration: refused a connection to {} from {who} ({n} refused so far): only this VMM's user and root may send it a guest",
        path.display()
    );
    if n == 1 || n % 1000 == 0 {
        log::warn!("{said}");
    } else {
        log::debug!("{said}");
    }
}

/// Whether a peer of uid `peer` may send a guest to a VMM run as `own`:
/// the same user, or root (who could anyway).
fn may_send(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Unix(l, _) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// What is at a destination's `unix:` path is replaced only if it is a
    /// socket nobody listens on: a file there is refused, and kept.
    #[test]
    fn a_destination_never_replaces_a_file_or_a_live_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("precious.txt");
        std::fs::write(&path, "data").unwrap();
        let e = Listener::bind(&Uri::Unix(path.clone()))
            .map(|_| ())
            .unwrap_err();
        assert!(
            crate::error_chain(&e).contains("exists and is not a socket; not replacing it"),
            "{}",
            crate::error_chain(&e)
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        let live = dir.path().join("live.sock");
        let _other = UnixListener::bind(&live).unwrap();
        let e = Listener::bind(&Uri::Unix(live.clone()))
            .map(|_| ())
            .unwrap_err();
        assert!(
            crate::error_chain(&e).contains("in use by a running server"),
            "{e}"
        );
        // A stale one is replaced, and removed when the listener goes.
        let stale = dir.path().join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let l = Listener::bind(&Uri::Unix(stale.clone())).unwrap();
        assert!(UnixStream::connect(&stale).is_ok());
        drop(l);
        assert!(!stale.exists());
    }

    /// A source that always has bytes ready never makes a read wait: the
    /// stop is looked at between reads too, and a read after it fails.
    #[test]
    fn a_stop_ends_the_reads_of_a_source_that_never_pauses() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let flood = std::thread::spawn(move || {
            let chunk = [0u8; 4096];
            while theirs.write_all(&chunk).is_ok() {}
        });
        let asked = Arc::new(AtomicBool::new(false));
        let stop: Stop = {
            let asked = asked.clone();
            Arc::new(move || asked.load(Ordering::Relaxed).then(|| "quit".to_string()))
        };
        let mut w = Watched::new(Conn::from(ours), &[], Duration::from_secs(60), stop).unwrap();
        let mut buf = [0u8; 4096];
        let started = Instant::now();
        let err = loop {
            if started.elapsed() >= Duration::from_millis(300) {
                asked.store(true, Ordering::Relaxed);
            }
            match w.read(&mut buf) {
                Ok(n) => assert!(n > 0, "the flood ended"),
                Err(e) => break e,
            }
            // Not a timing goal: a read loop that never sees the stop.
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "still reading 30 s on, the stop asked for at 0.3 s"
            );
        };
        drop(w);
        flood.join().unwrap();
        assert!(
            matches!(halt_of(&err), Some(Halt::Stopped(why)) if why == "quit"),
            "{err}"
        );
    }

    #[test]
    fn only_the_vmms_user_and_root_may_send_it_a_guest() {
        assert!(may_send(1000, 1000));
        assert!(may_send(0, 1000));
        assert!(!may_send(65534, 1000));
        assert!(!may_send(1000, 0));
    }

    /// The socket is private whatever the umask; a peer of another uid that
    /// reaches it anyway (made reachable here on purpose) is refused on
    /// accept, and the next peer of ours is taken.
    #[test]
    fn a_unix_listener_is_private_and_refuses_another_users_peer() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let l = Listener::bind(&Uri::Unix(path.clone())).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        l.set_nonblocking().unwrap();
        if !rustix::process::geteuid().is_root() {
            // Only root can start a peer of another uid.
            return;
        }
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, open).unwrap();
        let connect = format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print(len(s.recv(1)))",
            path.display().to_string()
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &connect])
            .uid(65534)
            .gid(65534)
            .stdin(std::process::Stdio::null())
            .spawn();
        let Ok(child) = out else {
            return; // no python3 here
        };
        // Taken and refused: nothing comes, and the peer sees the end.
        let until = Instant::now() + Duration::from_secs(10);
        let mut child = child;
        loop {
            assert!(
                l.try_accept().unwrap().is_none(),
                "another user's peer was taken"
            );
            if child.try_wait().unwrap().is_some() || Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(child.wait().unwrap().success());
        let _mine = UnixStream::connect(&path).unwrap();
        let taken = (0..100).find_map(|_| {
            std::thread::sleep(Duration::from_millis(5));
            l.try_accept().unwrap()
        });
        assert!(taken.is_some(), "a peer of this user is taken");
    }
}
