//! Where a stream goes: `unix:PATH` or `tcp:HOST:PORT`, as QEMU's `-incoming`
//! and `migrate` name them; a connection ([`Conn`]) whose reads and writes
//! give up after a time without progress and, when one is set, past a
//! deadline for the whole (a peer that trickles is not silent); and the
//! destination's end of a connection ([`Watched`]), whose reads give up when
//! the source has sent nothing for the idle deadline or when the destination
//! is told to stop.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::units::format_duration;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is neither `unix:PATH` nor `tcp:HOST:PORT`.
    #[error("'{0}' is not a migration URI: use unix:PATH or tcp:HOST:PORT")]
    Uri(String),
    /// Binding the destination's socket failed (URI given).
    #[error("listening on {0}")]
    Listen(String, #[source] std::io::Error),
    /// Accepting the source's connection failed (URI given).
    #[error("waiting for the source on {0}")]
    Accept(String, #[source] std::io::Error),
    /// The source could not connect to the destination (URI given).
    #[error("connecting to {0}")]
    Connect(String, #[source] std::io::Error),
    /// A cancel came while the source waited to connect (URI given).
    #[error("cancelled while connecting to {0}")]
    ConnectCancelled(String),
}

/// Longest a source waits to connect to a destination (to resolve its
/// name, and then each address it resolves to).
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// Waits for `slice` to give an answer: each call waits at most `TICK`
/// (`Ok(None)`: nothing yet), and between them the cancel is looked at.
/// `Err(None)` for a cancel, `TimedOut` naming `what` past `until`.
fn in_slices<T>(
    until: Instant,
    cancelled: &dyn Fn() -> bool,
    what: &str,
    mut slice: impl FnMut(Duration) -> std::io::Result<Option<T>>,
) -> Result<T, Option<std::io::Error>> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let limit = format_duration(CONNECT_LIMIT);
            return Err(Some(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} within {limit}"),
            )));
        }
        if let Some(done) = slice(left.min(TICK)).map_err(Some)? {
            return Ok(done);
        }
        if cancelled() {
            return Err(None);
        }
    }
}

/// Resolves `HOST:PORT` on a thread of its own, so that a cancel is taken
/// within [`TICK`] and a resolver that never answers is given up on after
/// [`CONNECT_LIMIT`] (`getaddrinfo` cannot be interrupted; the thread ends
/// when it returns).
fn resolve(
    addr: &str,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<std::net::SocketAddr>, Option<std::io::Error>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let name = addr.to_string();
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let _ = tx.send(name.to_socket_addrs().map(Iterator::collect));
        })
        .map_err(Some)?;
    let until = Instant::now() + CONNECT_LIMIT;
    in_slices(
        until,
        cancelled,
        "no answer from the resolver",
        |wait| match rx.recv_timeout(wait) {
            Ok(answer) => answer.map(Some),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(std::io::Error::other(
                "the resolver's thread ended without an answer",
            )),
        },
    )
}

/// Connects to `a` within [`CONNECT_LIMIT`], looking at `cancelled` every
/// [`TICK`] (std's `connect_timeout` waited out its limit whatever came):
/// `Err(None)` for a cancel.
fn tcp_connect(
    a: std::net::SocketAddr,
    cancelled: &dyn Fn() -> bool,
) -> Result<TcpStream, Option<std::io::Error>> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let io = |e: rustix::io::Errno| Some(std::io::Error::from(e));
    let family = if a.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    let fd = rustix::net::socket_with(family, SocketType::STREAM, flags, None).map_err(io)?;
    match rustix::net::connect(&fd, &a) {
        Ok(()) => {}
        Err(rustix::io::Errno::INPROGRESS) => {
            let until = Instant::now() + CONNECT_LIMIT;
            in_slices(until, cancelled, "no answer", |wait| {
                let wait = Timespec::try_from(wait).map_err(std::io::Error::other)?;
                let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                match poll(&mut fds, Some(&wait)) {
                    Ok(0) | Err(rustix::io::Errno::INTR) => Ok(None),
                    Ok(_) => Ok(Some(())),
                    Err(e) => Err(e.into()),
                }
            })?;
            sockopt::socket_error(&fd).map_err(io)?.map_err(io)?;
        }
        Err(e) => return Err(io(e)),
    }
    rustix::io::ioctl_fionbio(&fd, false).map_err(io)?;
    Ok(TcpStream::from(fd))
}

/// A migration endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uri {
    /// `unix:PATH`: a unix stream socket at PATH.
    Unix(PathBuf),
    /// `tcp:HOST:PORT`, kept as `HOST:PORT` and resolved when used.
    Tcp(String),
}

impl std::str::FromStr for Uri {
    type Err = Error;

    fn from_str(s: &str) -> Result<Uri, Error> {
        match s.split_once(':') {
            Some(("unix", path)) if !path.is_empty() => Ok(Uri::Unix(PathBuf::from(path))),
            Some(("tcp", addr))
                if addr
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
            {
                Ok(Uri::Tcp(addr.to_string()))
            }
            _ => Err(Error::Uri(s.to_string())),
        }
    }
}

impl std::fmt::Display for Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uri::Unix(p) => write!(f, "unix:{}", p.display()),
            Uri::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// One connection, either kind, with an optional whole deadline on its
/// reads and writes.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: Sock,
    /// Past this instant every read and write fails ([`PastDeadline`], with
    /// the limit it was set from), however the peer trickles: the socket's
    /// timeouts bound only the time without progress.
    until: Option<(Instant, Duration)>,
}

#[derive(Debug)]
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl From<Sock> for Conn {
    fn from(sock: Sock) -> Self {
        Conn { sock, until: None }
    }
}

/// What a [`Conn`]'s read or write gives up with (inside a `TimedOut`
/// `io::Error`) once its whole deadline has passed: the limit.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("past its whole deadline of {}", format_duration(*.0))]
pub(crate) struct PastDeadline(pub(crate) Duration);

/// The whole deadline an I/O error from a [`Conn`] gave up on, if that is why.
pub(crate) fn past_deadline(e: &std::io::Error) -> Option<PastDeadline> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<PastDeadline>())
        .copied()
}

impl Conn {
    /// Connects to a listening destination.
    ///
    /// # Errors
    /// `Connect` with the cause.
    pub(crate) fn connect(uri: &Uri, cancelled: &dyn Fn() -> bool) -> Result<Conn, Error> {
        let failed = |e| Error::Connect(uri.to_string(), e);
        let cancel = || Error::ConnectCancelled(uri.to_string());
        let sock =
            match uri {
                // A listener whose backlog is full takes nobody: std's connect
                // waited on it for ever, deaf to a cancel. Now 10 s at most, as
                // TCP's, in slices that look at the cancel.
                Uri::Unix(path) => {
                    let until = Instant::now() + CONNECT_LIMIT;
                    let what = "no place in its backlog (it accepts nobody)";
                    let s = in_slices(until, cancelled, what, |wait| {
                        match crate::client::bounded_connect(path, wait) {
                            Ok(s) => Ok(Some(s)),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                            Err(e) => Err(e),
                        }
                    });
                    Sock::Unix(s.map_err(|e| e.map_or_else(cancel, failed))?)
                }
                Uri::Tcp(addr) => {
                    let addrs =
                        resolve(addr, cancelled).map_err(|e| e.map_or_else(cancel, failed))?;
                    let mut last = std::io::Error::other("the address resolves to nothing");
                    let mut connected = None;
                    for a in addrs {
                        match tcp_connect(a, cancelled) {
                            Ok(s) => {
                                let _ = s.set_nodelay(true);
                                connected = Some(s);
                                break;
                            }
                            Err(None) => return Err(cancel()),
                            Err(Some(e)) => last = e,
                        }
                    }
                    Sock::Tcp(connected.ok_or_else(|| failed(last))?)
                }
            };
        Ok(Conn::from(sock))
    }

    /// A second handle on the same connection (to shut it down from another
    /// thread), without a whole deadline.
    ///
    /// # Errors
    /// The fd could not be duplicated.
    pub(crate) fn try_clone(&self) -> std::io::Result<Conn> {
        let sock = match &self.sock {
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
        };
        Ok(Conn::from(sock))
    }

    /// Ends the connection both ways, waking any thread blocked on it.
    pub(crate) fn shutdown(&self) {
        let _ = match &self.sock {
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Limits how long a read may block without progress.
    ///
    /// # Errors
    /// The socket option could not be set.
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
        }
    }

    /// Limits how long a write may block without progress.
    ///
    /// # Errors
    /// The socket option could not be set.
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// Until cleared, reads and writes fail ([`PastDeadline`]) once `limit`
    /// from now has passed, whether or not the peer makes progress.
    pub(crate) fn set_whole_deadline(&mut self, limit: Duration) {
        self.until = Some((Instant::now() + limit, limit));
    }

    /// Ends the whole deadline: only the socket's timeouts apply.
    pub(crate) fn clear_whole_deadline(&mut self) {
        self.until = None;
    }

    /// Runs `f` on this connection with a whole deadline of `limit` from
    /// now (or the one already set, if sooner), then puts the one before back.
    pub(crate) fn within<T>(&mut self, limit: Duration, f: impl FnOnce(&mut Conn) -> T) -> T {
        let before = self.until;
        let at = Instant::now() + limit;
        if before.is_none_or(|(was, _)| at < was) {
            self.until = Some((at, limit));
        }
        let out = f(self);
        self.until = before;
        out
    }

    /// Makes reads and writes return `WouldBlock` instead of waiting (or wait again).
    ///
    /// # Errors
    /// The flag could not be set.
    pub(crate) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match &self.sock {
            Sock::Unix(s) => s.set_nonblocking(on),
            Sock::Tcp(s) => s.set_nonblocking(on),
        }
    }

    /// Moves bytes with `io` (which must not wait: `MSG_DONTWAIT`); where it
    /// would, waits for `ready` up to the socket's `timeout` (looked up only
    /// then: most calls go at once) and the whole deadline. Past the first,
    /// `WouldBlock`; past the second, [`PastDeadline`].
    fn without_waiting(
        &self,
        ready: rustix::event::PollFlags,
        timeout: rustix::net::sockopt::Timeout,
        mut io: impl FnMut() -> rustix::io::Result<usize>,
    ) -> std::io::Result<usize> {
        use rustix::event::{poll, PollFd, Timespec};
        let past = |limit| std::io::Error::new(std::io::ErrorKind::TimedOut, PastDeadline(limit));
        let whole = self.until;
        if let Some((at, limit)) = whole {
            if Instant::now() >= at {
                return Err(past(limit));
            }
        }
        let mut stalled_at: Option<Option<Instant>> = None;
        loop {
            match io() {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::AGAIN) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let stall = match stalled_at {
                Some(at) => at,
                None => *stalled_at.insert(
                    rustix::net::sockopt::socket_timeout(self, timeout)?
                        .map(|l| Instant::now() + l),
                ),
            };
            let now = Instant::now();
            let mut left = None;
            if let Some((at, limit)) = whole {
                if now >= at {
                    return Err(past(limit));
                }
                left = Some(at - now);
            }
            if let Some(at) = stall {
                if now >= at {
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                left = Some(left.map_or(at - now, |l: Duration| l.min(at - now)));
            }
            let left = left
                .map(|l| Timespec::try_from(l).map_err(std::io::Error::other))
                .transpose()?;
            let mut fds = [PollFd::new(self, ready)];
            match poll(&mut fds, left.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.sock {
            Sock::Unix(s) => s.as_fd(),
            Sock::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for Conn {
    /// Reads as the socket's mode says; under a whole deadline, waits for
    /// bytes up to the read timeout (time without progress) and the deadline.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use rustix::event::PollFlags;
        use rustix::net::{sockopt::Timeout, RecvFlags};
        if self.until.is_none() {
            return match &mut self.sock {
                Sock::Unix(s) => s.read(buf),
                Sock::Tcp(s) => s.read(buf),
            };
        }
        self.without_waiting(PollFlags::IN, Timeout::Recv, || {
            rustix::net::recv(&*self, &mut *buf, RecvFlags::DONTWAIT).map(|(n, _)| n)
        })
    }
}

impl Write for Conn {
    /// Sends what the socket takes now; where it takes nothing, waits for
    /// room up to its send timeout, and fails `WouldBlock` past it. So the
    /// timeout bounds the time without progress: a blocking send with
    /// `SO_SNDTIMEO` that copied a little and then waited returned at the
    /// timeout, and the next waited as long again (a peer that read nothing
    /// held a source twice its stall limit). A whole deadline bounds it too.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use rustix::event::PollFlags;
        use rustix::net::{sockopt::Timeout, SendFlags};
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        self.without_waiting(PollFlags::OUT, Timeout::Send, || {
            rustix::net::send(&*self, buf, flags)
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How often a destination waiting on a peer looks at its stop condition.
pub(crate) const TICK: Duration = Duration::from_millis(100);

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
    /// The socket file is removed when the listener goes.
    Unix(UnixListener, PathBuf),
    /// Listening on TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Listens at `uri`. A unix socket file left by a dead process is replaced.
    ///
    /// # Errors
    /// `Listen` with the cause.
    pub(crate) fn bind(uri: &Uri) -> Result<Listener, Error> {
        let failed = |e| Error::Listen(uri.to_string(), e);
        match uri {
            Uri::Unix(path) => {
                if UnixStream::connect(path).is_err() {
                    let _ = std::fs::remove_file(path);
                }
                let l = UnixListener::bind(path).map_err(failed)?;
                // Whoever sends a guest here runs it as this VMM's user: the
                // socket is this user's (as the control socket is), whatever
                // the umask, and each peer's uid is checked on accept too.
                use std::os::unix::fs::PermissionsExt;
                let private = std::fs::Permissions::from_mode(0o600);
                if let Err(e) = std::fs::set_permissions(path, private) {
                    let _ = std::fs::remove_file(path);
                    return Err(failed(e));
                }
                // The stream carries no fds: a peer may send none.
                let _ = crate::scm::refuse_fds(&l);
                Ok(Listener::Unix(l, path.clone()))
            }
            Uri::Tcp(addr) => TcpListener::bind(addr.as_str())
                .map(Listener::Tcp)
                .map_err(failed),
        }
    }

    /// The URI as error messages name it.
    fn name(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
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
            Listener::Unix(l, path) => loop {
                match l.accept() {
                    Ok((s, _)) => match crate::scm::peer_uid(&s) {
                        Ok(uid) if may_send(uid, rustix::process::geteuid().as_raw()) => {
                            break Ok(Conn::from(Sock::Unix(s)));
                        }
                        // Closed; the next waiting peer is looked at.
                        peer => refused(path, peer),
                    },
                    Err(e) => break Err(e),
                }
            },
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::from(Sock::Tcp(s))
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

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_like_qemus() {
        assert_eq!(
            "unix:/tmp/m.sock".parse::<Uri>().unwrap(),
            Uri::Unix("/tmp/m.sock".into())
        );
        assert_eq!(
            "tcp:127.0.0.1:4444".parse::<Uri>().unwrap(),
            Uri::Tcp("127.0.0.1:4444".into())
        );
        for bad in ["", "unix:", "tcp:host", "tcp::80", "file:/x", "tcp:h:99999"] {
            assert!(bad.parse::<Uri>().is_err(), "{bad}");
        }
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
        let mut w = Watched::new(
            Conn::from(Sock::Unix(ours)),
            &[],
            Duration::from_secs(60),
            stop,
        )
        .unwrap();
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

    /// A peer that reads nothing fails a write after the send timeout once,
    /// not twice: a write that copied a little returned at the timeout, and
    /// `write_all`'s next call waited as long again.
    #[test]
    fn a_peer_that_trickles_is_given_up_on_at_the_whole_deadline() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(Sock::Unix(ours));
        // Silence alone would wait a minute: a byte every 20 ms is never silent.
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let trickle = std::thread::spawn(move || {
            for _ in 0..200 {
                if theirs.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            theirs
        });
        let limit = Duration::from_millis(300);
        conn.set_whole_deadline(limit);
        let mut buf = [0u8; 100];
        let e = conn.read_exact(&mut buf).unwrap_err();
        assert_eq!(past_deadline(&e).map(|p| p.0), Some(limit), "{e}");
        // A reply read out of turn gets its own, shorter one, and the one
        // before is back after it.
        let e = conn
            .within(Duration::from_millis(50), |c| c.read_exact(&mut buf))
            .unwrap_err();
        assert!(past_deadline(&e).is_some(), "{e}");
        conn.clear_whole_deadline();
        conn.read_exact(&mut buf[..2]).unwrap();
        // Writes are held to it too, room or not.
        conn.set_whole_deadline(Duration::ZERO);
        let e = conn.write_all(b"late").unwrap_err();
        assert!(past_deadline(&e).is_some(), "{e}");
        drop(conn);
        trickle.join().unwrap();
    }

    #[test]
    fn a_connect_in_slices_takes_a_cancel_and_names_its_limit() {
        let mut calls = 0;
        let cancelled = std::cell::Cell::new(false);
        let r: Result<(), _> = in_slices(
            Instant::now() + Duration::from_secs(60),
            &|| cancelled.get(),
            "no answer",
            |_| {
                calls += 1;
                cancelled.set(calls == 3);
                Ok(None)
            },
        );
        assert!(matches!(r, Err(None)), "a cancel: {r:?}");
        assert_eq!(calls, 3);
        let r: Result<(), _> = in_slices(Instant::now(), &|| false, "no answer", |_| Ok(None));
        let e = r.unwrap_err().expect("not a cancel");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(e.to_string(), "no answer within 10s");
    }

    #[test]
    fn a_peer_that_reads_nothing_fails_the_write_within_one_send_timeout() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(Sock::Unix(ours));
        let limit = Duration::from_millis(500);
        conn.set_write_timeout(Some(limit)).unwrap();
        let big = vec![0u8; 64 << 20];
        let started = Instant::now();
        let e = conn.write_all(&big).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        // The bound under test, with room for a busy host's wake-up; twice
        // the limit (1 s) was what it took.
        assert!(took >= limit && took < limit * 9 / 5, "{took:?}");
        drop(theirs);
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
