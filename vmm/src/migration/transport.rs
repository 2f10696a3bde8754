//! Where a stream goes: `unix:PATH` or `tcp:HOST:PORT`, as QEMU's `-incoming`
//! and `migrate` name them; connecting to it, bounded and cancellable; and a
//! connection ([`Conn`]) whose reads and writes give up after a time without
//! progress and, when one is set, past a deadline for the whole (a peer that
//! trickles is not silent). The destination's end is `inbound.rs`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
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
    /// The destination's socket file could not be made (URI given): the
    /// path holds a live socket or something else, or is too long.
    #[error("listening on {0}")]
    SocketFile(String, #[source] crate::socket_file::Error),
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

/// Name lookups still running on threads of their own, at most
/// [`MAX_LOOKUPS`] (each one given up on is left to end by itself).
static LOOKUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The most name lookups left running at once.
const MAX_LOOKUPS: usize = 4;

/// Resolves `HOST:PORT`: an address as it is; a name on a thread of its own,
/// so that a cancel is taken within [`TICK`] and a resolver that never
/// answers is given up on after [`CONNECT_LIMIT`] (`getaddrinfo` cannot be
/// interrupted; the thread ends when it returns, and while [`MAX_LOOKUPS`]
/// of them run no other starts).
fn resolve(
    addr: &str,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<std::net::SocketAddr>, Option<std::io::Error>> {
    use std::sync::atomic::Ordering;
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return Ok(vec![a]);
    }
    let running = LOOKUPS.fetch_add(1, Ordering::AcqRel);
    if running >= MAX_LOOKUPS {
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return Err(Some(std::io::Error::other(format!(
            "{running} name lookups given up on are still running: the resolver does not answer"
        ))));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = addr.to_string();
    let spawned = std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let _ = tx.send(name.to_socket_addrs().map(Iterator::collect));
            LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return Err(Some(e));
    }
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
    /// Past this instant every read and write that would wait fails
    /// ([`PastDeadline`], with the limit it was set from), however the peer
    /// trickles: the socket's timeouts bound only the time without progress.
    until: Option<(Instant, Duration)>,
    /// When bytes last moved either way (or the whole deadline was set): a
    /// peer silent since for a socket timeout is said to be silent, not
    /// slow, whichever bound ran out first.
    progress: std::cell::Cell<Instant>,
}

#[derive(Debug)]
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl From<Sock> for Conn {
    fn from(sock: Sock) -> Self {
        Conn {
            sock,
            until: None,
            progress: std::cell::Cell::new(Instant::now()),
        }
    }
}

impl From<UnixStream> for Conn {
    fn from(s: UnixStream) -> Self {
        Conn::from(Sock::Unix(s))
    }
}

impl From<TcpStream> for Conn {
    fn from(s: TcpStream) -> Self {
        Conn::from(Sock::Tcp(s))
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

    /// Ends the connection both ways, then, on a unix socket, the bytes the
    /// peer never took ([`Conn::unsent`]): where there are any, the peer
    /// never read the stream's end, and nothing it writes from now on can
    /// reach this side (its write fails), so a destination cannot answer
    /// COMPLETED for it. `None` over TCP, where a peer's kernel may hold
    /// and pass on what it acknowledged.
    pub(crate) fn shut_with_unread(&self) -> Option<u64> {
        self.shutdown();
        match &self.sock {
            Sock::Unix(_) => Some(self.unsent()),
            Sock::Tcp(_) => None,
        }
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
        let now = Instant::now();
        self.until = Some((now + limit, limit));
        self.progress.set(now);
    }

    /// Bytes written and not yet taken by the peer (`SIOCOUTQ`): they go
    /// before anything written next (a unix socket counts the kernel's
    /// overhead per packet with them; TCP the bytes not yet acknowledged).
    /// 0 where the kernel does not say.
    pub(crate) fn unsent(&self) -> u64 {
        use std::os::fd::AsRawFd as _;
        let mut queued: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer,
        // which points at one; the fd is this connection's socket.
        let r = unsafe { libc::ioctl(self.as_fd().as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        if r == 0 {
            u64::try_from(queued).unwrap_or(0)
        } else {
            0
        }
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
    /// `WouldBlock`; past the second, [`PastDeadline`], unless nothing moved
    /// for the socket's timeout: that is silence (`WouldBlock`) too. The
    /// whole deadline is looked at only when the call would wait: bytes or
    /// room that are there are taken, however late.
    fn without_waiting(
        &self,
        ready: rustix::event::PollFlags,
        timeout: rustix::net::sockopt::Timeout,
        mut io: impl FnMut() -> rustix::io::Result<usize>,
    ) -> std::io::Result<usize> {
        use rustix::event::{poll, PollFd, Timespec};
        let silence = || std::io::Error::from(std::io::ErrorKind::WouldBlock);
        let mut stall: Option<(Option<Duration>, Option<Instant>)> = None;
        loop {
            match io() {
                Ok(n) => {
                    if n > 0 {
                        self.progress.set(Instant::now());
                    }
                    return Ok(n);
                }
                Err(rustix::io::Errno::AGAIN) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let (limit, stall_at) = match stall {
                Some(s) => s,
                None => {
                    let limit = rustix::net::sockopt::socket_timeout(self, timeout)?;
                    *stall.insert((limit, limit.map(|l| Instant::now() + l)))
                }
            };
            let now = Instant::now();
            let mut left = None;
            if let Some(at) = stall_at {
                if now >= at {
                    return Err(silence());
                }
                left = Some(at - now);
            }
            if let Some((at, whole)) = self.until {
                if now >= at {
                    let silent = limit.is_some_and(|l| now - self.progress.get() >= l);
                    return Err(if silent {
                        silence()
                    } else {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, PastDeadline(whole))
                    });
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

/// How often a wait on a peer looks at its stop condition or cancel.
pub(crate) const TICK: Duration = Duration::from_millis(100);

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

    /// A peer that sends a byte every 20 ms is never silent: the whole
    /// deadline ends the read, where silence alone would wait a minute.
    #[test]
    fn a_peer_that_trickles_is_given_up_on_at_the_whole_deadline() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(ours);
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let trickle = std::thread::spawn(move || {
            while theirs.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let limit = Duration::from_millis(300);
        conn.set_whole_deadline(limit);
        let started = Instant::now();
        let mut buf = [0u8; 100];
        let e = conn.read_exact(&mut buf).unwrap_err();
        assert_eq!(past_deadline(&e).map(|p| p.0), Some(limit), "{e}");
        assert!(started.elapsed() >= limit);
        // A shorter deadline for one reply, inside it: its own limit, and
        // the one before is back after it.
        conn.clear_whole_deadline();
        let short = Duration::from_millis(50);
        let started = Instant::now();
        let e = conn.within(short, |c| c.read_exact(&mut buf)).unwrap_err();
        assert_eq!(past_deadline(&e).map(|p| p.0), Some(short), "{e}");
        assert!(started.elapsed() >= short);
        assert!(conn.until.is_none(), "none before, none after");
        conn.set_whole_deadline(Duration::from_secs(60));
        let before = conn.until;
        let _ = conn.within(short, |c| c.read_exact(&mut buf));
        assert_eq!(conn.until, before, "the minute's deadline is back");
        drop(conn);
        trickle.join().unwrap();
    }

    /// Past the whole deadline, a peer that said nothing for its silence
    /// bound is said to be silent, whichever bound ran out first; bytes
    /// already there are taken, however late.
    #[test]
    fn silence_is_named_as_silence_and_waiting_bytes_are_taken_late() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(ours);
        let silence = Duration::from_millis(100);
        conn.set_read_timeout(Some(silence)).unwrap();
        // The same limit for both, as READY's: silence, not slowness.
        conn.set_whole_deadline(silence);
        let mut buf = [0u8; 4];
        let e = conn.read_exact(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        assert!(past_deadline(&e).is_none(), "{e}");
        // The deadline long past, four bytes waiting: read.
        theirs.write_all(b"late").unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late");
        // A write with room goes; one that would wait past the deadline fails.
        conn.set_whole_deadline(Duration::ZERO);
        conn.write_all(b"room").unwrap();
        let e = conn.write_all(&vec![0u8; 64 << 20]).unwrap_err();
        assert!(past_deadline(&e).is_some(), "{e}");
        drop(theirs);
    }

    /// What the socket holds unsent is counted (the stop's deadline adds it).
    #[test]
    fn bytes_the_peer_has_not_taken_are_counted() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(ours);
        assert_eq!(conn.unsent(), 0);
        conn.write_all(&[0u8; 1000]).unwrap();
        // A unix socket counts the kernel's own bytes per packet too.
        let unsent = conn.unsent();
        assert!((1000..1000 + 4096).contains(&unsent), "{unsent}");
        drop(theirs);
    }

    #[test]
    fn an_address_is_not_looked_up_and_a_name_is() {
        let direct = resolve("127.0.0.1:4444", &|| false).unwrap();
        assert_eq!(direct, vec!["127.0.0.1:4444".parse().unwrap()]);
        // `localhost` is in every /etc/hosts: looked up on a thread, which ends.
        let named = resolve("localhost:4444", &|| false).unwrap();
        assert!(
            named
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 4444),
            "{named:?}"
        );
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

    /// A peer that reads nothing fails a write after the send timeout once,
    /// not twice: a write that copied a little returned at the timeout, and
    /// `write_all`'s next call waited as long again.
    #[test]
    fn a_peer_that_reads_nothing_fails_the_write_within_one_send_timeout() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = Conn::from(ours);
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
}
