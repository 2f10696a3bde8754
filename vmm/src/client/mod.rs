//! Clients of the control socket (docs/PROTOCOL.md): a [`Client`] that sends
//! requests and receives replies with the fds riding on them, and the commands
//! built on it: `kvmscope stats`, `watch`, `ctl`, `readiness`, `migrate` and
//! `demo`, and their standard output (`output`).
//!
//! `stats` and `watch` read the kernel themselves through the fds they receive;
//! they never ask the VMM for values.

pub mod demo;
pub mod migrate;
pub mod output;
pub(crate) mod predict;
pub mod readiness;
pub mod stats;
pub mod watch;

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize as _;
use serde_json::{json, Value};

use crate::protocol::events::{EventKind, ScanProgress};
use crate::protocol::guest::GuestCommandReply;
use crate::protocol::migration::{
    Capability, CapabilityStatus, MigrateArgs, MigrationInfo, Parameters, SetCapabilities,
    SetParameters,
};
use crate::protocol::readiness::ReadinessReport;
use crate::protocol::reply::{QmpError, StatusInfo};
use crate::protocol::request::{
    request_line, CapabilitiesArgs, GetStatsFdArgs, GuestCommandArgs, NoArgs, QuerySamplesArgs,
    ReadinessRequest, StatsProvider, VcpusArgs,
};
use crate::protocol::samples::SamplesPage;
use crate::protocol::vm::{StatsFdEntry, StatsFds, VcpuExits, VmInfo};
use crate::protocol::{
    Command, ErrorClass, Event, Greeting, Message, StatsTarget, VcpuRef, VcpuSelector,
};
use crate::scm::{self, MAX_FDS_PER_MESSAGE};

/// How long `stats`, `watch` and `demo` wait for a reply before giving up.
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client waits for the greeting and the answer to
/// `qmp_capabilities`, all told: a kvmscope VMM greets at once, and a socket
/// that accepts and says nothing (a QEMU monitor another client holds, a
/// stuck process) must not hold a command forever.
pub(crate) const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest reply line a client accepts (a `query-stats` of 256 vCPUs is ~1 MiB).
const MAX_REPLY: usize = 64 << 20;

/// Room for input a client keeps between lines.
const KEPT_INPUT: usize = 256 << 10;

/// Longest greeting a client accepts (a kvmscope VMM's is under 1 KiB): a
/// server's first line of 60 MiB took the client to 2.9 GB.
const MAX_GREETING: usize = 64 << 10;

/// Most event lines a client skips while it waits for one reply: a server
/// that sends events without end does not hold the request for ever.
const MAX_EVENTS_PER_REPLY: usize = 1 << 20;

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `connect(2)` to the socket path failed.
    #[error("connecting to {0}")]
    Connect(PathBuf, #[source] io::Error),
    /// Waiting for a VMM to start serving: nothing answered in time.
    #[error("no control socket answered at {0} within {1:?}")]
    NotReady(PathBuf, Duration),
    /// The socket accepted, and no greeting (or no answer to
    /// `qmp_capabilities`) came within [`GREETING_TIMEOUT`].
    #[error("{0} accepted the connection and gave no whole greeting within {1:?}: not a kvmscope VMM, or a stuck one (a QEMU monitor that another client holds says nothing until it is free)")]
    Silent(PathBuf, Duration),
    /// The socket greeted, and did not answer `qmp_capabilities` within
    /// [`GREETING_TIMEOUT`] of the connection.
    #[error("{0} greeted, then did not answer qmp_capabilities within {1:?} of the connection: a stuck VMM, or not one")]
    SilentAfterGreeting(PathBuf, Duration),
    /// Reading or writing the socket failed.
    #[error("talking to the VMM")]
    Io(#[from] io::Error),
    /// The VMM hung up before the reply (end of stream, or the connection
    /// reset: a VMM that exited or was killed with a request unread).
    #[error("the VMM closed the connection (it exited, or dropped this client)")]
    Closed,
    /// The VMM process whose stats were read has exited (its fds still
    /// read, but nothing moves them any more).
    #[error("the VMM (pid {0}) has exited: its stats no longer move")]
    VmmExited(u64),
    /// A line that is not a QMP greeting, reply or event (the line is given).
    #[error("the VMM sent something that is not a reply: {0}")]
    BadReply(String),
    /// The greeting was an error (e.g. every client slot taken).
    #[error("the VMM refused the connection ({class}): {desc}")]
    Refused {
        /// QMP error class.
        class: ErrorClass,
        /// The VMM's description.
        desc: String,
    },
    /// A command only kvmscope has, asked of another QMP server (its
    /// greeting's version, its answer).
    #[error("this socket is QEMU {0}'s QMP monitor, not a kvmscope VMM ({1}); QEMU's stats are read by `kvmscope exporter --qmp-socket PATH`")]
    NotKvmscope(String, String),
    /// A kvmscope VMM's socket given where a QEMU monitor was expected
    /// (`exporter --qmp-socket`).
    #[error("{0} is a kvmscope VMM's socket, not a QEMU monitor: give it with --socket or --vm-sockets (its stats fds are then read with no request)")]
    NotQemu(PathBuf),
    /// The command's reply was an error.
    #[error("the VMM answered {class}: {desc}")]
    Remote {
        /// QMP error class.
        class: ErrorClass,
        /// The VMM's description.
        desc: String,
    },
    /// A stats fd that came with a reply could not be read.
    #[error("reading a received stats fd")]
    Stats(#[from] kvm_stats::Error),
    /// A received fd is not a readable stats file: whose it was said to be,
    /// and what it is.
    #[error("the stats fd the VMM sent for {what} is not a readable stats file (it is {is:?})")]
    NotStats {
        /// `the VM (kvm)`, `vCPU 1 (kvmscope)`.
        what: String,
        /// Its `/proc/self/fd` link (`pipe:[N]`, a path).
        is: String,
        /// Why reading it failed.
        #[source]
        source: kvm_stats::Error,
    },
    /// A received fd is not of the kind a stats fd is (what it was said to
    /// be, what it is, what it should be): not read at all.
    #[error("the stats fd the VMM sent for {what} is not a readable stats file (it is {is:?}, not {kind}); it was not read")]
    NotStatsKind {
        /// `the VM (kvm)`, `vCPU 1 (kvmscope)`.
        what: String,
        /// Its `/proc/self/fd` link.
        is: String,
        /// The kind it should be (`kvm-vm-stats`, `kvmscope-stats`).
        kind: &'static str,
    },
    /// Starting or waiting for a child VMM (the demo) failed.
    #[error("the VMM process")]
    Child(#[source] io::Error),
    /// A child VMM exited before it was done.
    #[error("the VMM exited early ({0})")]
    ChildExited(std::process::ExitStatus),
    /// `ctl` was given a request no reply would ever come for: an empty one,
    /// or one that ends inside a JSON value (a QMP server waits for the rest).
    #[error("{0}: give a QMP command as JSON, e.g. '{{\"execute\": \"query-status\"}}'")]
    Unanswerable(&'static str),
    /// `migrate` asked of a VMM that would refuse to start one (why):
    /// found before any parameter or capability was changed.
    #[error("the VMM cannot start a migration: {0}; nothing was changed")]
    CannotMigrate(String),
    /// A `--names` pattern no stat name could match.
    #[error("--names {0}")]
    BadPattern(#[from] kvm_stats::BadPattern),
}

/// A reply line and the fds that came with it, in order.
#[derive(Debug)]
pub struct Reply {
    /// The reply (`{"return": ...}`) or event line, parsed.
    pub value: Value,
    pub(crate) fds: Vec<File>,
}

/// What a client allows a server: for agents (the exporter) that must not be
/// held by a VMM that answers slowly, never, or without end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The whole of each request, from its first byte sent to the last of
    /// its reply read, however the server dribbles it (the greeting and
    /// negotiation together count as one request).
    pub(crate) request: Duration,
    /// Longest line accepted, bytes.
    pub(crate) line_max: usize,
}

/// A connection to a control socket, past its greeting.
pub struct Client {
    stream: UnixStream,
    input: Vec<u8>,
    /// Where the lines not yet taken begin in `input` (the bytes before are
    /// dropped now and then, not after each line: a buffer of many short
    /// lines was moved down once per line).
    start: usize,
    /// Where in `input` the search for a newline goes on from.
    scanned: usize,
    /// Longest line accepted.
    line_max: usize,
    /// Each request's whole deadline, when bounded.
    request_limit: Option<Duration>,
    /// When the request under way must be done by.
    deadline: Option<Instant>,
    /// Received fds, each tagged with the index in `input` of the last byte of
    /// the read that brought it: it belongs to the line holding that byte.
    fds: Vec<(usize, File)>,
    /// The server's greeting (`{"QMP": {...}}`).
    pub greeting: Greeting,
}

/// Connects to the socket at `path`. A refused connection says why, as far
/// as the file tells: a socket nobody listens on any more (a VMM that was
/// killed leaves its socket file behind), or a file that is not a socket at
/// all (`connect` refuses both alike). The error keeps its kind.
fn connect_stream(path: &Path, limit: Duration) -> Result<UnixStream, Error> {
    bounded_connect(path, limit).map_err(|e| {
        use std::os::unix::fs::FileTypeExt;
        let hint = match std::fs::metadata(path).map(|m| m.file_type()) {
            // A listener whose backlog is full makes a connect wait for a
            // place (for ever, unbounded): it accepts nobody.
            _ if e.kind() == io::ErrorKind::WouldBlock => Some(format!(
                "no connection was accepted within {limit:?}: the server's backlog is full (it accepts nobody)"
            )),
            _ if e.kind() != io::ErrorKind::ConnectionRefused => None,
            Ok(t) if t.is_socket() => Some("nothing listens on this socket (its VMM has exited without removing it, or was killed)".into()),
            Ok(t) if t.is_dir() => Some("it is a directory, not a socket".into()),
            Ok(_) => Some("it is not a socket".into()),
            Err(_) => None,
        };
        let e = match hint {
            Some(hint) => io::Error::new(e.kind(), format!("{e}: {hint}")),
            None => e,
        };
        Error::Connect(path.to_path_buf(), e)
    })
}

/// Connects to the Unix socket at `path`, waiting at most `limit` for a
/// place in its backlog (`SO_SNDTIMEO`, which a Unix `connect` honours;
/// `std`'s would wait for ever on a server that accepts nobody).
pub(crate) fn bounded_connect(path: &Path, limit: Duration) -> io::Result<UnixStream> {
    use rustix::net::{sockopt, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_socket_timeout(
        &fd,
        sockopt::Timeout::Send,
        Some(limit.max(Duration::from_millis(1))),
    )?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, None)?;
    Ok(UnixStream::from(fd))
}

impl Client {
    /// Connects, reads the greeting and negotiates capabilities, ready for commands.
    ///
    /// # Errors
    /// `Connect` if nobody listens at `path`; `Refused` if the server says why
    /// it will not serve us (too many busy clients, wrong uid); `BadReply` if
    /// it is not a kvmscope (or QMP) server; `Silent` if it says nothing
    /// within [`GREETING_TIMEOUT`].
    pub fn connect(path: &Path) -> Result<Client, Error> {
        let mut client = Client::negotiated_within(path, MAX_REPLY, GREETING_TIMEOUT)?;
        // The requests after it wait as long as their command does (the
        // socket's timeouts were what was left of the deadline).
        client.deadline = None;
        client.set_timeout(None)?;
        Ok(client)
    }

    /// Connects and negotiates within `bounds.request` all told (however the
    /// server dribbles its greeting), then holds every later request to the
    /// same whole deadline, and every line to `bounds.line_max`.
    ///
    /// # Errors
    /// As [`Client::connect`]; past the deadline an `Io` error of kind
    /// `TimedOut`; a longer line `BadReply`.
    pub(crate) fn connect_bounded(path: &Path, bounds: Bounds) -> Result<Client, Error> {
        Client::negotiated_within(path, bounds.line_max, bounds.request)
    }

    /// Connects, reads the greeting and negotiates, all within `limit`,
    /// every line up to `line_max`; the deadline stays on the client. A
    /// socket that says nothing whole by then is `Silent` (a QEMU monitor
    /// another client holds accepts and says nothing until it is free).
    fn negotiated_within(path: &Path, line_max: usize, limit: Duration) -> Result<Client, Error> {
        // One deadline for the connect and what follows it.
        let deadline = Instant::now() + limit;
        let stream = connect_stream(path, limit)?;
        let timed_out = |greeted: bool| {
            move |e: Error| match e {
                Error::Io(e) if e.kind() == io::ErrorKind::TimedOut && greeted => {
                    Error::SilentAfterGreeting(path.to_path_buf(), limit)
                }
                Error::Io(e) if e.kind() == io::ErrorKind::TimedOut => {
                    Error::Silent(path.to_path_buf(), limit)
                }
                e => e,
            }
        };
        let mut client =
            Client::greeted_within(stream, line_max, deadline).map_err(timed_out(false))?;
        client
            .call(&Command::QmpCapabilities(CapabilitiesArgs::default()))
            .map_err(timed_out(true))?;
        Ok(client)
    }

    /// A client on `stream` whose lines are at most `line_max` and whose
    /// greeting (and what follows, until [`Client::bound_each_request`])
    /// must be in by `deadline`.
    fn greeted_within(
        stream: UnixStream,
        line_max: usize,
        deadline: Instant,
    ) -> Result<Client, Error> {
        let mut client = Client::new(stream);
        client.line_max = line_max.min(MAX_GREETING);
        client.deadline = Some(deadline);
        client.read_greeting()?;
        client.line_max = line_max;
        Ok(client)
    }

    /// The server's process id, from the socket's peer credentials (as
    /// this process's pid namespace numbers it).
    pub(crate) fn peer_pid(&self) -> Option<u32> {
        scm::peer_cred(&self.stream).ok().and_then(|c| c.pid)
    }

    /// A kvmscope VMM's process id as this process sees it: the socket's
    /// peer credentials, else the greeting's (which is the VMM's own view,
    /// another number where it runs in a pid namespace of its own).
    pub(crate) fn vmm_pid(&self) -> u32 {
        self.peer_pid().unwrap_or(self.greeting.qmp.kvmscope.vm.pid)
    }

    /// Gives each request from now on its own whole deadline of `limit`;
    /// until this is called, a bounded client's requests share the deadline
    /// its connection began with (an attach that is one deadline all told).
    pub(crate) fn bound_each_request(&mut self, limit: Duration) {
        self.request_limit = Some(limit);
        // The shared deadline is over with the requests it covered.
        self.deadline = None;
    }

    /// A bounded client on a connected stream, past its greeting (for the
    /// fuzz body: what a peer sends, without a socket file).
    ///
    /// # Errors
    /// As [`Client::connect_bounded`], without the negotiation.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn from_stream(stream: UnixStream, bounds: Bounds) -> Result<Client, Error> {
        Client::greeted_within(stream, bounds.line_max, Instant::now() + bounds.request)
    }

    fn new(stream: UnixStream) -> Client {
        Client {
            stream,
            input: Vec::new(),
            start: 0,
            scanned: 0,
            line_max: MAX_REPLY,
            request_limit: None,
            deadline: None,
            fds: Vec::new(),
            greeting: Greeting::default(),
        }
    }

    fn read_greeting(&mut self) -> Result<(), Error> {
        let input = self;
        let first = input.read_reply()?.value;
        match serde_json::from_value::<Message>(first.clone()) {
            Ok(Message::Greeting(g)) => {
                input.greeting = g;
                Ok(())
            }
            Ok(Message::Error { error, .. }) => Err(Error::Refused {
                class: error.class,
                desc: crate::units::peer_text(error.desc.as_bytes(), 1000),
            }),
            _ => Err(Error::BadReply(format!(
                "expected a kvmscope greeting, got {}",
                crate::units::peer_text(first.to_string().as_bytes(), 200)
            ))),
        }
    }

    /// Connects once the socket at `path` accepts, trying until `timeout`, as
    /// long as `starting()` says the server may still come up.
    ///
    /// # Errors
    /// `NotReady` after `timeout`; `ChildExited` (or another error) from `starting`.
    pub fn connect_when_ready(
        path: &Path,
        timeout: Duration,
        mut starting: impl FnMut() -> Result<(), Error>,
    ) -> Result<Client, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            match Client::connect(path) {
                // Not there yet, not listening yet, or its backlog full.
                Err(Error::Connect(_, e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound
                            | io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::WouldBlock
                    ) => {}
                other => return other,
            }
            starting()?;
            if Instant::now() >= deadline {
                return Err(Error::NotReady(path.to_path_buf(), timeout));
            }
            // Readiness of another process's socket has no event to wait on.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The lines the server sent unasked (events) that have arrived, without
    /// blocking. Call it only between requests (no reply outstanding).
    ///
    /// # Errors
    /// `Closed` once the server has hung up (after the events before it were
    /// taken), `BadReply` for a line that is not JSON, or the read failure.
    pub(crate) fn take_events(&mut self) -> Result<Vec<Value>, Error> {
        /// Bytes one look takes at most: a server that sends without end
        /// cannot keep it reading.
        const LOOK: usize = 4 << 20;
        self.stream.set_nonblocking(true)?;
        let mut read = 0;
        let received = loop {
            if self.pending() > self.line_max || read > LOOK {
                break Ok(false);
            }
            match self.receive() {
                Ok(0) => break Ok(true),
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        self.stream.set_nonblocking(false)?;
        let closed = received?;
        let mut events = Vec::new();
        // Events carry no fds: any that came are closed with their line.
        while let Some(line) = self.take_line(parsed::<Value>) {
            events.push(line?.0);
        }
        // What is left is one line not yet whole: past the limit it never
        // will be (left, it would stop every later look from reading, the
        // end of the stream included).
        if self.pending() > self.line_max {
            return Err(Error::BadReply(format!(
                "a line longer than {} bytes",
                self.line_max
            )));
        }
        if closed && events.is_empty() {
            return Err(Error::Closed);
        }
        Ok(events)
    }

    /// Bounds how long a read or write may block (`None`: forever).
    ///
    /// # Errors
    /// The `setsockopt` failure.
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        Ok(())
    }

    /// Sends one raw line (a newline is added if missing).
    ///
    /// # Errors
    /// The write failure.
    pub fn send_line(&mut self, line: &[u8]) -> Result<(), Error> {
        let mut buf = line.to_vec();
        if buf.last() != Some(&b'\n') {
            buf.push(b'\n');
        }
        self.start_request();
        self.write(&buf)
    }

    /// A bounded client's request starts now: its whole deadline with it.
    fn start_request(&mut self) {
        if let Some(limit) = self.request_limit {
            self.deadline = Some(Instant::now() + limit);
        }
    }

    /// What is left of the request's deadline, set as the socket's timeout
    /// for the next read or write; `TimedOut` once it has passed.
    fn arm_deadline(&self) -> io::Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(past_deadline());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let mut rest = bytes;
        while !rest.is_empty() {
            self.arm_deadline()?;
            match self.stream.write(rest) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if hung_up(&e) => return Err(Error::Closed),
                Err(e)
                    if self.deadline.is_some()
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    return Err(past_deadline().into())
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads the next line and the fds that rode on it.
    ///
    /// # Errors
    /// `Closed` at end of stream, `BadReply` for a line that is not JSON or too
    /// long, or the read failure.
    pub fn read_reply(&mut self) -> Result<Reply, Error> {
        let (value, fds) = self.read_line(parsed::<Value>)?;
        Ok(Reply { value, fds })
    }

    /// Reads the next line as `parse` makes it, and the fds that rode on it.
    ///
    /// # Errors
    /// As [`Client::read_reply`]; a line `parse` refuses is `BadReply`,
    /// with the reason and the line's start.
    fn read_line<R>(
        &mut self,
        parse: impl Fn(&[u8]) -> serde_json::Result<R>,
    ) -> Result<(R, Vec<File>), Error> {
        loop {
            if let Some(line) = self.take_line(&parse) {
                return line;
            }
            if self.pending() > self.line_max {
                return Err(Error::BadReply(format!(
                    "a line longer than {} bytes",
                    self.line_max
                )));
            }
            self.arm_deadline()?;
            match self.receive() {
                Ok(0) => return Err(Error::Closed),
                Ok(_) => {}
                Err(e) if hung_up(&e) => return Err(Error::Closed),
                // The socket's timeout is what was left of the deadline.
                Err(e)
                    if self.deadline.is_some()
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    return Err(past_deadline().into())
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Splits the next complete line off the input, as `parse` makes it,
    /// with the fds that rode on it; `None` while no line is complete.
    fn take_line<R>(
        &mut self,
        parse: impl Fn(&[u8]) -> serde_json::Result<R>,
    ) -> Option<Result<(R, Vec<File>), Error>> {
        // Only the bytes that came since the last look: a line is searched
        // once, however many reads it takes to arrive.
        let from = self.scanned.max(self.start);
        let Some(found) = self.input[from..].iter().position(|&b| b == b'\n') else {
            self.scanned = self.input.len();
            return None;
        };
        let nl = from + found;
        let line = &self.input[self.start..=nl];
        let parsed = parse(line).map_err(|e| {
            // The peer's bytes, on one line of a log and not all of a
            // 64 KiB line.
            let shown = crate::units::peer_text(line.trim_ascii_end(), 200);
            Error::BadReply(format!("{e}: {shown}"))
        });
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.fds)
            .into_iter()
            .partition(|(at, _)| *at <= nl);
        self.fds = rest;
        self.start = nl + 1;
        self.scanned = self.start;
        self.compact();
        Some(parsed.map(|value| (value, mine.into_iter().map(|(_, f)| f).collect())))
    }

    /// Bytes received and not yet taken as lines.
    fn pending(&self) -> usize {
        self.input.len() - self.start
    }

    /// Drops the bytes of lines taken, once they are all of the buffer or
    /// the larger part of it (so each byte moves down a few times at most).
    fn compact(&mut self) {
        if self.start == self.input.len() {
            self.input.clear();
            // A long line's room goes back (a peer's 8 MiB line left 16 MiB
            // held for the connection's life).
            self.input.shrink_to(KEPT_INPUT);
        } else if self.start >= 64 << 10 && self.start * 2 >= self.input.len() {
            self.input.drain(..self.start);
            for (at, _) in &mut self.fds {
                *at -= self.start;
            }
        } else {
            return;
        }
        self.scanned -= self.start;
        self.start = 0;
    }

    /// One `recvmsg` into the input, each fd tagged with the last byte that
    /// came with it; `Ok(0)` at the end of the stream.
    fn receive(&mut self) -> io::Result<usize> {
        let mut buf = vec![0u8; 64 << 10];
        let mut fds = Vec::new();
        let n = scm::recv_with_fds(&self.stream, &mut buf, &mut fds, MAX_FDS_PER_MESSAGE)?;
        self.input.extend_from_slice(&buf[..n]);
        if let Some(at) = self.input.len().checked_sub(1) {
            self.fds.extend(fds.into_iter().map(|f| (at, f)));
        }
        Ok(n)
    }

    /// Reads lines up to the next reply, handing each event line before it
    /// (`{"event": ...}`) to `on_event`.
    ///
    /// # Errors
    /// As [`Client::read_reply`], or what `on_event` returns.
    pub fn read_reply_after_events(
        &mut self,
        mut on_event: impl FnMut(&Value) -> Result<(), Error>,
    ) -> Result<Reply, Error> {
        let (value, fds) = self.read_after_events(
            parsed::<Value>,
            |v| v.get("event").is_some(),
            |v| on_event(v),
        )?;
        Ok(Reply { value, fds })
    }

    /// Reads lines as `parse` makes them up to the first that is not an
    /// event (`is_event`), handing each event to `on_event`; at most
    /// [`MAX_EVENTS_PER_REPLY`] events.
    ///
    /// # Errors
    /// As [`Client::read_line`], `BadReply` past the events' bound, or what
    /// `on_event` returns.
    fn read_after_events<R>(
        &mut self,
        parse: impl Fn(&[u8]) -> serde_json::Result<R>,
        is_event: impl Fn(&R) -> bool,
        mut on_event: impl FnMut(&R) -> Result<(), Error>,
    ) -> Result<(R, Vec<File>), Error> {
        for _ in 0..=MAX_EVENTS_PER_REPLY {
            let (line, fds) = self.read_line(&parse)?;
            if !is_event(&line) {
                return Ok((line, fds));
            }
            on_event(&line)?;
        }
        Err(Error::BadReply(format!(
            "more than {MAX_EVENTS_PER_REPLY} events and no reply"
        )))
    }

    /// Runs a command: its `return` value and fds, or its error as `Remote`.
    /// Event lines that arrive before the reply are skipped.
    ///
    /// # Errors
    /// `Remote` for an error reply, or a transport error.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: Value,
    ) -> Result<(Value, Vec<File>), Error> {
        let line = json!({"execute": command, "arguments": arguments}).to_string();
        self.send_line(line.as_bytes())?;
        self.read_return()
    }

    /// Runs a typed command: its `return` value and fds, or its error as `Remote`.
    ///
    /// # Errors
    /// As [`Client::execute`].
    pub(crate) fn call(&mut self, command: &Command) -> Result<(Value, Vec<File>), Error> {
        self.start_request();
        self.write(&request_line(command, None))?;
        self.read_return()
    }

    /// Runs a typed command whose return is read straight off its line as
    /// `T`, skipping events before it; fds that ride on the reply are
    /// closed. No JSON tree is built first: a tree takes up to some 30
    /// times the bytes of its line (8 MiB of `[0,0,...]` took 250 MB), the
    /// typed value about what the line says, and a part `T` does not take
    /// is skipped without being kept.
    ///
    /// # Errors
    /// As [`Client::execute`]; `BadReply` for a reply whose return is not
    /// a `T`, naming why.
    pub(crate) fn call_as<T: serde::de::DeserializeOwned>(
        &mut self,
        command: &Command,
    ) -> Result<T, Error> {
        self.start_request();
        self.write(&request_line(command, None))?;
        let (line, _) =
            self.read_after_events(typed_line::<T>, |l| l.event.is_some(), |_| Ok(()))?;
        match line {
            TypedLine { value: Some(v), .. } => Ok(v),
            TypedLine { error: Some(e), .. } => Err(self.remote(e.class, e.desc)),
            // `typed_line` refuses a line with none of the three.
            TypedLine { .. } => Err(Error::BadReply("an empty reply".into())),
        }
    }

    /// Queues workload text on a vCPU (`guest-command`); with `wait`, replies
    /// once every command finished, with the results.
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for a return of another shape.
    pub fn guest_command(
        &mut self,
        vcpu: usize,
        command: &str,
        wait: bool,
    ) -> Result<GuestCommandReply, Error> {
        self.call_as(&Command::GuestCommand(GuestCommandArgs {
            vcpu,
            command: command.to_string(),
            wait,
        }))
    }

    /// The VM: its backend, vCPUs, memory map and stats ids (`query-vm`).
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for a return of another shape.
    pub fn query_vm(&mut self) -> Result<VmInfo, Error> {
        self.call_as(&Command::QueryVm(NoArgs::default()))
    }

    /// Sends `command`, hands each event line before its reply to
    /// `on_event`, typed (events this build does not know are skipped), and
    /// returns the reply's value and fds.
    ///
    /// # Errors
    /// As [`Client::execute`], `BadReply` for an event of the wrong shape, or
    /// what `on_event` returns.
    pub(crate) fn call_with_events(
        &mut self,
        command: &Command,
        mut on_event: impl FnMut(EventKind) -> Result<(), Error>,
    ) -> Result<(Value, Vec<File>), Error> {
        self.start_request();
        self.write(&request_line(command, None))?;
        let Reply { value, fds } = self.read_reply_after_events(|line| match event_of(line)? {
            Some(kind) => on_event(kind),
            None => Ok(()),
        })?;
        let shown_as = shown(&value);
        match decode::<Message>(value)? {
            Message::Return { value, .. } => Ok((value, fds)),
            Message::Error { error, .. } => Err(self.remote(error.class, error.desc)),
            _ => Err(Error::BadReply(shown_as)),
        }
    }

    /// The migration-readiness report (`query-readiness`); each scan
    /// progress event before it goes to `on_progress`.
    ///
    /// # Errors
    /// As [`Client::call_with_events`], or `BadReply` for a report of another shape.
    pub fn query_readiness(
        &mut self,
        args: ReadinessRequest,
        mut on_progress: impl FnMut(ScanProgress),
    ) -> Result<ReadinessReport, Error> {
        let command = Command::QueryReadiness(args);
        let (value, _) = self.call_with_events(&command, |event| {
            if let EventKind::ReadinessProgress(p) = event {
                on_progress(p);
            }
            Ok(())
        })?;
        decode(value)
    }

    /// A page of the sampler's points after `since` (`query-samples`); with
    /// `max`, the newest `max` of them.
    ///
    /// # Errors
    /// As [`Client::execute`] (a VMM without a sampler answers `Remote`), or
    /// `BadReply` for a page of another shape.
    pub fn query_samples(&mut self, since: u64, max: Option<u64>) -> Result<SamplesPage, Error> {
        self.call_as(&Command::QuerySamples(QuerySamplesArgs { since, max }))
    }

    /// The VM's run state (`query-status`).
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for a status of another shape.
    pub(crate) fn query_status(&mut self) -> Result<StatusInfo, Error> {
        self.call_as(&Command::QueryStatus(NoArgs {}))
    }

    /// The VMM's own exit counters of some vCPUs (all when `None`), `query-exits`.
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for counters of another shape.
    pub fn query_exits(&mut self, vcpus: Option<Vec<VcpuRef>>) -> Result<Vec<VcpuExits>, Error> {
        self.call_as(&Command::QueryExits(VcpusArgs { vcpus }))
    }

    /// Stats fds of the VM or some vCPUs (`get-stats-fd`): the reply's
    /// entries and the fds, one per entry, in order.
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for a reply of another shape or
    /// one whose fds do not match its entries.
    pub fn get_stats_fd(
        &mut self,
        target: StatsTarget,
        vcpu: Option<VcpuSelector>,
    ) -> Result<Vec<(StatsFdEntry, File)>, Error> {
        self.get_provider_stats_fd(None, target, vcpu)
    }

    /// As [`Client::get_stats_fd`], of `provider`'s stats: KVM's (`None`,
    /// `kvm`) or the VMM's own (`kvmscope`).
    ///
    /// # Errors
    /// As [`Client::get_stats_fd`]; a VMM without the provider answers `Remote`.
    pub(crate) fn get_provider_stats_fd(
        &mut self,
        provider: Option<StatsProvider>,
        target: StatsTarget,
        vcpu: Option<VcpuSelector>,
    ) -> Result<Vec<(StatsFdEntry, File)>, Error> {
        let args = GetStatsFdArgs {
            target,
            provider,
            vcpu,
        };
        let (value, fds) = self.call(&Command::GetStatsFd(args))?;
        let reply: StatsFds = decode(value)?;
        if reply.fds.len() != fds.len() {
            return Err(Error::BadReply(format!(
                "the reply names {} fds but carried {}",
                reply.fds.len(),
                fds.len()
            )));
        }
        Ok(reply.fds.into_iter().zip(fds).collect())
    }

    /// Changes the migration parameters given (`migrate-set-parameters`).
    ///
    /// # Errors
    /// As [`Client::execute`].
    pub fn migrate_set_parameters(&mut self, params: SetParameters) -> Result<(), Error> {
        self.call(&Command::MigrateSetParameters(params)).map(drop)
    }

    /// Turns one migration capability on or off (`migrate-set-capabilities`).
    ///
    /// # Errors
    /// As [`Client::execute`].
    pub fn migrate_set_capabilities(
        &mut self,
        capabilities: &[(Capability, bool)],
    ) -> Result<(), Error> {
        let args = SetCapabilities {
            capabilities: capabilities
                .iter()
                .map(|&(capability, state)| CapabilityStatus { capability, state })
                .collect(),
        };
        self.call(&Command::MigrateSetCapabilities(args)).map(drop)
    }

    /// The migration parameters in force (`query-migrate-parameters`).
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for parameters of another shape.
    pub fn query_migrate_parameters(&mut self) -> Result<Parameters, Error> {
        self.call_as(&Command::QueryMigrateParameters(NoArgs {}))
    }

    /// Starts a migration to `uri` (`unix:PATH` or `tcp:HOST:PORT`).
    ///
    /// # Errors
    /// As [`Client::execute`].
    pub fn migrate(&mut self, uri: &str) -> Result<(), Error> {
        let args = MigrateArgs {
            uri: uri.to_string(),
            detach: None,
            blk: None,
            inc: None,
            resume: None,
        };
        self.call(&Command::Migrate(args)).map(drop)
    }

    /// The migration's status and counters (`query-migrate`).
    ///
    /// # Errors
    /// As [`Client::execute`], or `BadReply` for a status of another shape.
    pub fn query_migrate(&mut self) -> Result<MigrationInfo, Error> {
        self.call_as(&Command::QueryMigrate(NoArgs {}))
    }

    /// Stops the VMM (`quit`); it closes the connection after the reply.
    ///
    /// # Errors
    /// As [`Client::execute`].
    pub fn quit(&mut self) -> Result<(), Error> {
        self.call(&Command::Quit(NoArgs {})).map(drop)
    }

    /// The error for an error reply: a command a QEMU monitor does not know
    /// (its greeting names no kvmscope) says what the socket is.
    fn remote(&self, class: ErrorClass, desc: String) -> Error {
        // The peer's words, on one line wherever they are shown or logged.
        let desc = crate::units::peer_text(desc.as_bytes(), 1000);
        let version = &self.greeting.qmp.version;
        if class == ErrorClass::CommandNotFound && !version.is_kvmscope() {
            let v = &version.qemu;
            return Error::NotKvmscope(format!("{}.{}.{}", v.major, v.minor, v.micro), desc);
        }
        Error::Remote { class, desc }
    }

    /// Reads up to the next reply (skipping events): its value and fds.
    fn read_return(&mut self) -> Result<(Value, Vec<File>), Error> {
        // Like a QMP client, skip event lines (progress, subscribed samples).
        let Reply { mut value, fds } = self.read_reply_after_events(|_| Ok(()))?;
        if let Some((class, desc)) = error_reply(&value) {
            return Err(self.remote(class, desc));
        }
        match value.get_mut("return") {
            Some(v) => Ok((v.take(), fds)),
            None => Err(Error::BadReply(shown(&value))),
        }
    }
}

/// A reply line read as the command's return type: an event, a return or an
/// error (a return is taken before an error, as `error_reply` does). A key
/// that is there counts, whatever its value (`"return": null` is a return
/// of the wrong shape, not none).
#[derive(serde::Deserialize)]
#[serde(bound(deserialize = "T: serde::de::DeserializeOwned"))]
struct TypedLine<T> {
    #[serde(rename = "return", default, deserialize_with = "present")]
    value: Option<T>,
    #[serde(default, deserialize_with = "present")]
    error: Option<QmpError>,
    #[serde(default, deserialize_with = "present")]
    event: Option<serde::de::IgnoredAny>,
}

/// A key's value, `Some` however it reads (null included).
fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A reply line as `T`'s command returns it; a line with no return, error
/// or event is refused, so that the error shows it.
fn typed_line<T: serde::de::DeserializeOwned>(line: &[u8]) -> serde_json::Result<TypedLine<T>> {
    let typed: TypedLine<T> = serde_json::from_slice(line)?;
    if typed.value.is_none() && typed.error.is_none() && typed.event.is_none() {
        return Err(serde::de::Error::custom(
            "a line with neither a return, an error nor an event",
        ));
    }
    Ok(typed)
}

/// A line as `T`.
fn parsed<T: serde::de::DeserializeOwned>(line: &[u8]) -> serde_json::Result<T> {
    serde_json::from_slice(line)
}

/// A bounded request that ran past its deadline.
fn past_deadline() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the VMM did not complete its answer within the deadline",
    )
}

/// A command's return as the protocol type it should be.
///
/// # Errors
/// `BadReply` with the value, when it is not of that shape.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Error> {
    // Read from the tree in place: a copy of a reply of megabytes took as much again.
    T::deserialize(&value).map_err(|e| Error::BadReply(format!("{e}: {}", shown(&value))))
}

/// A peer's value as an error shows it: on one line, escaped, cut (a
/// reply of megabytes was put whole into the message).
fn shown(value: &Value) -> String {
    crate::units::peer_text(value.to_string().as_bytes(), 200)
}

/// An event line, typed; `None` for an event this build does not know.
///
/// # Errors
/// `BadReply` for a line that is not an event, or a known event of another shape.
pub(crate) fn event_of(line: &Value) -> Result<Option<EventKind>, Error> {
    decode::<Event>(line.clone())?
        .kind()
        .map_err(|_| Error::BadReply(shown(line)))
}

/// The class and description of an error reply (`{"error": {...}}`), if it is one.
pub(crate) fn error_reply(line: &Value) -> Option<(ErrorClass, String)> {
    // Only the error body is typed, read in place: this is asked of every
    // reply, and a copy of a reply of megabytes took as much again.
    let error = line
        .as_object()
        .filter(|o| !o.contains_key("return"))?
        .get("error")?;
    let body = QmpError::deserialize(error).ok()?;
    Some((body.class, body.desc))
}

/// `kvmscope ctl`: negotiates, sends the raw request line and prints each
/// reply: one per JSON value in it (`{...} {...}` asks twice), and one for
/// each run of bytes the VMM skips (its parse error), counted with the VMM's
/// own framer. Returns whether every reply was a success (`return`).
///
/// # Errors
/// An empty request (nothing would ever answer it), or a transport failure
/// (an error reply is printed and returns `Ok(false)`).
pub fn ctl(socket: &Path, line: &str, out: &mut dyn Write) -> Result<bool, Error> {
    if line.trim().is_empty() {
        return Err(Error::Unanswerable("an empty request"));
    }
    // Split as the VMM splits it: one reply per value, and one per run of
    // bytes it skips; what is left open would be waited on for ever.
    let mut framer = crate::protocol::framing::Framer::new();
    framer.extend(line.as_bytes());
    framer.extend(b"\n");
    let requests = std::iter::from_fn(|| framer.next_frame(false)).count();
    if framer.partial() {
        return Err(Error::Unanswerable(
            "the request ends inside a JSON value (the VMM would wait for the rest)",
        ));
    }
    let mut client = Client::connect(socket)?;
    client.send_line(line.as_bytes())?;
    let mut all_ok = true;
    for _ in 0..requests {
        // Event lines (progress) come before the reply: print them too.
        let reply = client.read_reply_after_events(|event| Ok(writeln!(out, "{event}")?))?;
        writeln!(out, "{}", reply.value)?;
        if !reply.fds.is_empty() {
            // The fds were received (and are closed now); the reply names them.
            log::info!("the reply carried {} fds", reply.fds.len());
        }
        all_ok &= reply.value.get("return").is_some();
    }
    Ok(all_ok)
}

/// Whether a socket error means the peer is gone (its end closed with data
/// unread, or closed before a write).
fn hung_up(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::events::MigrationChange;

    /// Why connecting to `path` failed (a test's expected failure).
    fn connect_error(path: &Path) -> Error {
        match Client::connect(path) {
            Err(e) => e,
            Ok(_) => panic!("{path:?}: connected"),
        }
    }

    #[test]
    fn a_socket_that_accepts_and_says_nothing_is_given_up_on_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        match connect_error(&path) {
            e @ Error::Silent(..) => {
                assert!(
                    e.to_string().contains("gave no whole greeting within 5s"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The whole greeting's deadline, not forever (nor per read).
        assert!(started.elapsed() >= GREETING_TIMEOUT);
        drop(listener);
    }

    /// One that greets and never answers `qmp_capabilities` is said to be
    /// that, not to have given no greeting.
    #[test]
    fn a_socket_that_greets_and_never_answers_the_negotiation_is_said_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mute.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, \"package\": \"\"}, \"capabilities\": []}}\n").unwrap();
            // Held open, silent, until the client gives up.
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut rest);
        });
        let e = connect_error(&path);
        assert!(matches!(e, Error::SilentAfterGreeting(..)), "{e:?}");
        assert!(
            e.to_string()
                .contains("greeted, then did not answer qmp_capabilities within 5s"),
            "{e}"
        );
        server.join().unwrap();
    }

    /// A listener whose backlog is full (it accepts nobody): a connect waits
    /// for a place, which `std`'s would do for ever; a bounded client's
    /// waits its deadline, and says why.
    #[test]
    fn a_server_that_accepts_nobody_is_given_up_on_within_the_deadline() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        let listener = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        rustix::net::listen(&listener, 0).unwrap();
        // Backlog 0 holds one: the next waits.
        let _first = UnixStream::connect(&path).unwrap();
        let bounds = Bounds {
            request: Duration::from_millis(300),
            line_max: 1 << 16,
        };
        let started = Instant::now();
        match Client::connect_bounded(&path, bounds) {
            Err(e @ Error::Connect(..)) => {
                let said = crate::error_chain(&e);
                assert!(said.contains("backlog is full"), "{said}");
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "bounded");
    }

    #[test]
    fn a_command_only_kvmscope_has_asked_of_qemu_says_the_socket_is_qemus() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qemu.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // QEMU 7.2's greeting, then its answers: {} to qmp_capabilities,
            // CommandNotFound to the next command.
            s.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, \"package\": \"Debian 1:7.2+dfsg-7\"}, \"capabilities\": [\"oob\"]}}\n").unwrap();
            let mut lines = std::io::BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
            s.write_all(b"{\"return\": {}}\n").unwrap();
            line.clear();
            std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
            s.write_all(b"{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command get-stats-fd has not been found\"}}\n").unwrap();
        });
        let mut client = Client::connect(&path).unwrap();
        let e = client
            .execute("get-stats-fd", serde_json::json!({"target": "vm"}))
            .unwrap_err();
        let said = e.to_string();
        assert!(matches!(e, Error::NotKvmscope(..)), "{e:?}");
        assert!(
            said.starts_with("this socket is QEMU 7.2.22's QMP monitor, not a kvmscope VMM"),
            "{said}"
        );
        assert!(said.contains("kvmscope exporter --qmp-socket"), "{said}");
        server.join().unwrap();
    }

    #[test]
    fn a_refused_connection_says_whether_the_path_is_a_stale_socket_or_no_socket() {
        let dir = tempfile::tempdir().unwrap();
        let said = |path: &Path| match connect_error(path) {
            e @ Error::Connect(..) => crate::error_chain(&e),
            other => panic!("{path:?}: {other:?}"),
        };
        // A socket whose listener is gone (a VMM killed with SIGKILL).
        let stale = dir.path().join("vm.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert!(
            said(&stale).contains("nothing listens on this socket"),
            "{}",
            said(&stale)
        );
        assert!(said(dir.path()).ends_with("it is a directory, not a socket"));
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, "x").unwrap();
        assert!(said(&file).ends_with("it is not a socket"));
        // No file: the system's word for it, nothing added.
        let none = said(&dir.path().join("none.sock"));
        assert!(
            none.contains("No such file") && !none.contains("socket"),
            "{none}"
        );
        // The kind is kept: waiting for a VMM to come up still retries.
        match connect_error(&stale) {
            Error::Connect(_, e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused),
            other => panic!("{other:?}"),
        }
    }
    use crate::protocol::migration::Status;

    /// A line that grows past the limit between requests is an error, not a
    /// look that finds nothing for ever (the server's end unseen behind it).
    #[test]
    fn an_endless_line_between_requests_is_refused_not_waited_on() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut c = Client::new(ours);
        c.line_max = 1 << 16;
        std::io::Write::write_all(&mut &theirs, &vec![b'x'; 1 << 17]).unwrap();
        drop(theirs);
        let e = (0..100)
            .find_map(|_| c.take_events().err())
            .expect("a hundred looks found nothing and never the end");
        assert!(
            e.to_string().contains("a line longer than 65536 bytes"),
            "{e}"
        );
    }

    /// Many lines in one buffer are taken in order, the buffer dropped now
    /// and then, and an fd stays with the line it came with across that.
    #[test]
    fn lines_by_the_hundred_thousand_keep_their_order_and_their_fds() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut c = Client::new(ours);
        let writer = std::thread::spawn(move || {
            use std::io::Write as _;
            let mut theirs = theirs;
            let events: String = (0..100_000)
                .map(|i| format!("{{\"event\":\"E\",\"data\":{{\"n\":{i}}}}}\n"))
                .collect();
            theirs.write_all(events.as_bytes()).unwrap();
            let file = std::fs::File::open("/dev/null").unwrap();
            scm::send_with_fds(
                &theirs,
                b"{\"return\":{}}\n",
                &[std::os::fd::AsFd::as_fd(&file)],
            )
            .unwrap();
            theirs
        });
        let mut seen = 0u64;
        let reply = c
            .read_reply_after_events(|e| {
                assert_eq!(e["data"]["n"].as_u64(), Some(seen));
                seen += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, 100_000);
        assert_eq!(reply.value, json!({"return": {}}));
        assert_eq!(reply.fds.len(), 1, "the fd came with the reply");
        assert_eq!(c.pending(), 0);
        drop(writer.join().unwrap());
    }

    /// `call_as` reads a typed return straight off its line: events before
    /// it skipped (`"event": null` is one), an error reply in its class and
    /// words, a return of the wrong shape (null included) or a line with
    /// none of the three refused showing the line; and a long line's room
    /// is given back once it is taken.
    #[test]
    fn a_typed_call_takes_its_return_skips_events_and_names_what_is_wrong() {
        let big = format!(
            "{{\"event\": \"E\", \"data\": \"{}\"}}\n",
            "x".repeat(4 << 20)
        );
        let mut first = big.into_bytes();
        first.extend_from_slice(b"{\"event\": null}\n{\"return\": {\"running\": true, \"singlestep\": false, \"status\": \"running\"}}\n");
        let refused: [(&[u8], &str); 3] = [
            (b"{\"return\": null}\n", "invalid type: null"),
            (b"{\"return\": {\"running\": 1}}\n", "invalid type: integer"),
            (b"{\"id\": 7}\n", "neither a return, an error nor an event"),
        ];
        let mut answers = vec![
            first,
            b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}\n".to_vec(),
        ];
        answers.extend(refused.iter().map(|(l, _)| l.to_vec()));
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut asked = std::io::BufReader::new(theirs.try_clone().unwrap());
            let mut theirs = theirs;
            for lines in answers {
                let mut request = String::new();
                std::io::BufRead::read_line(&mut asked, &mut request).unwrap();
                theirs.write_all(&lines).unwrap();
            }
        });
        let mut c = Client::new(ours);
        let status = Command::QueryStatus(NoArgs {});
        let got: StatusInfo = c.call_as(&status).unwrap();
        assert!(got.running);
        assert!(c.input.capacity() <= KEPT_INPUT, "{}", c.input.capacity());
        let e = c.call_as::<StatusInfo>(&status).unwrap_err();
        assert!(
            matches!(&e, Error::Remote { desc, .. } if desc == "no"),
            "{e:?}"
        );
        for (line, why) in refused {
            let e = c.call_as::<StatusInfo>(&status).unwrap_err().to_string();
            let shown = String::from_utf8_lossy(line.trim_ascii_end()).into_owned();
            assert!(e.contains(why) && e.contains(&shown), "{e}");
        }
        server.join().unwrap();
    }

    fn line(message: &Message) -> Value {
        serde_json::from_slice(&message.to_line()).unwrap()
    }

    #[test]
    fn a_vmm_that_goes_with_a_request_unread_is_a_closed_connection() {
        use std::io::{BufRead, BufReader, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(br#"{"QMP":{"capabilities":[],"kvmscope":{"features":["stats-fd"],"protocol":2,"vm":{"backend":"pvm","memory":33554432,"name":"vm","pid":1,"stats-id":"kvm-1","vcpus":1}},"version":{"package":"kvmscope 0.1.0","qemu":{"major":0,"micro":0,"minor":1}}}}"#).unwrap();
            s.write_all(b"\n").unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut negotiation = String::new();
            r.read_line(&mut negotiation).unwrap();
            s.write_all(b"{\"return\":{}}\n").unwrap();
            // Waits for the next request, then goes without reading it: the
            // kernel resets the connection (ECONNRESET at the client).
            let mut byte = [0u8; 1];
            std::io::Read::read_exact(&mut s, &mut byte).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop((r, s));
        });
        let mut c = Client::connect(&path).unwrap();
        let e = c
            .execute("query-status", serde_json::json!({}))
            .unwrap_err();
        server.join().unwrap();
        assert!(matches!(e, Error::Closed), "{e:?}");
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }

    #[test]
    fn event_lines_from_the_server_decode_typed() {
        let progress = EventKind::ReadinessProgress(ScanProgress { done: 7, total: 9 });
        let sent = line(&Message::Event(Event::of(&progress)));
        assert_eq!(event_of(&sent).unwrap(), Some(progress));
        let migration = EventKind::Migration(MigrationChange {
            status: Status::Completed,
        });
        let sent = line(&Message::Event(Event::of(&migration)));
        assert_eq!(event_of(&sent).unwrap(), Some(migration));
    }

    #[test]
    fn unknown_events_are_skipped_and_malformed_ones_refused() {
        let newer = line(&Message::Event(Event::new("GUEST_PANICKED", Value::Null)));
        assert_eq!(event_of(&newer).unwrap(), None);
        let data = serde_json::from_str(r#"{"status": "sideways"}"#).unwrap();
        let bad = line(&Message::Event(Event::new("MIGRATION", data)));
        assert!(matches!(event_of(&bad), Err(Error::BadReply(_))));
    }
}
