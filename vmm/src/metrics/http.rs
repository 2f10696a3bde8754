//! A small HTTP/1.1 server for one read-only page: the `/metrics` exporter.
//!
//! One thread runs a `poll(2)` loop over the listener, a stop eventfd and at
//! most [`MAX_CONNECTIONS`] non-blocking connections, so a client that idles,
//! drips bytes or never reads its reply delays nobody else: each connection
//! only ever costs the loop one non-blocking read or write when it is ready.
//!
//! A connection's life:
//!
//! ```text
//! accept ──► Reading ──(blank line)──► Writing ──(all sent)──► Draining ──(EOF)──► closed
//!              │ head over 8 KiB: 431     │                     │ peer's leftover bytes
//!              │ 2 s from accept: 408     │ 5 s: closed          │ read and dropped, 1 s
//!              └─ oldest one evicted when a new connection finds the table full
//! ```
//!
//! Each connection carries one request, answered with `Connection: close`.
//! Lines may end in `\r\n` or a bare `\n`. The page is served for `GET` and
//! `HEAD` of its path, with any query string (Prometheus `params:`, proxies)
//! and in absolute form (`GET http://host/metrics`); other paths get 404 and
//! other methods 405 with `Allow`. Draining before the close keeps the kernel
//! from resetting the connection over unread request bytes, which would throw
//! away a reply (a 431 above all) the client has not read yet.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// Most connections held at once; a new one beyond evicts the oldest.
pub const MAX_CONNECTIONS: usize = 64;
/// Time from accept to the end of the request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time to send the reply once the head is in.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to wait for the peer to close after the reply, reading what it sends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes of request head (request line and header fields).
pub const MAX_HEAD: usize = 8192;
/// Most bytes read and dropped while draining.
const MAX_DRAIN: usize = 64 << 10;
/// Pause in accepting after an accept error other than "nothing to accept"
/// (out of fds): the listener stays readable, so retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be bound.
    #[error("listening on {0} for metrics")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The stop eventfd could not be made.
    #[error("creating the metrics server's stop eventfd")]
    EventFd(#[source] std::io::Error),
    /// The server thread could not start.
    #[error("starting the metrics thread")]
    Spawn(#[source] std::io::Error),
    /// The server's poll loop failed: the page stopped being served.
    #[error("the metrics server stopped serving")]
    Poll(#[source] std::io::Error),
    /// The server thread panicked.
    #[error("the metrics thread panicked")]
    Panicked,
}

/// The page the server serves.
pub(crate) struct Page {
    /// Its path, e.g. `/metrics`.
    pub(crate) path: &'static str,
    /// Its `Content-Type`.
    pub(crate) content_type: &'static str,
    /// Renders the body, on the server thread, for each `GET` and `HEAD`.
    /// Replies in flight share it; a renderer may take its buffer back
    /// (`Arc::try_unwrap`) once no reply holds it.
    pub(crate) render: Box<dyn FnMut() -> Arc<String> + Send>,
}

/// The running server; dropping it stops the thread and closes every connection.
pub(crate) struct Server {
    /// The address bound (with the real port when 0 was asked for).
    pub(crate) addr: SocketAddr,
    stop: OwnedFd,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl Server {
    /// Binds `addr` and serves `page` from a thread named `name`.
    ///
    /// # Errors
    /// The address cannot be bound, or the thread not started.
    pub(crate) fn start(addr: SocketAddr, name: &str, page: Page) -> Result<Server, Error> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| Error::Bind(addr, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Bind(addr, e))?;
        let stop = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map_err(|e| Error::EventFd(e.into()))?;
        let stop_clone = stop.try_clone().map_err(Error::EventFd)?;
        let worker = Loop {
            listener,
            stop: stop_clone,
            page,
            conns: Vec::new(),
            accept_paused_until: None,
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || worker.run())
            .map_err(Error::Spawn)?;
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Server {
    /// Stops the thread and says whether it had served to the end.
    ///
    /// # Errors
    /// `Poll` if its loop had failed, `Panicked` if it panicked.
    pub(crate) fn shutdown(mut self) -> Result<(), Error> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Result<(), Error> {
        // Fails only when the counter would overflow, which means it is already set.
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| Error::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = self.stop_thread() {
            log::error!("{}", crate::error_chain(&e));
        }
    }
}

/// What a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The page: `200`, with the body for `GET`, without for `HEAD`.
    Page {
        /// Whether the body goes too (`GET`), or only the head (`HEAD`).
        body: bool,
    },
    /// `404`: another path (the body names the page's path).
    NotFound,
    /// `405` with `Allow: GET, HEAD`.
    MethodNotAllowed,
    /// `400`: not an HTTP request line.
    BadRequest,
    /// `505`: not HTTP/1.x.
    VersionNotSupported,
    /// `431`: a head over `MAX_HEAD` bytes.
    HeadTooLarge,
    /// `408`: the head did not arrive within `HEAD_TIMEOUT`.
    Timeout,
}

/// Where the request head ends (the byte after its blank line), if it does.
/// Blank lines before the request line are skipped (RFC 9112 section 2.2).
pub(crate) fn head_end(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    let mut seen_line = false;
    while let Some(n) = buf[start..].iter().position(|&b| b == b'\n') {
        let line = trim_cr(&buf[start..start + n]);
        start += n + 1;
        if line.is_empty() && seen_line {
            return Some(start);
        }
        seen_line |= !line.is_empty();
    }
    None
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The path of a request target: origin form (`/metrics?x=1`) or absolute
/// form (`http://host:9100/metrics`), without query or fragment.
fn target_path(target: &str) -> &str {
    let origin = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let end = origin.find(['?', '#']).unwrap_or(origin.len());
    &origin[..end]
}

/// Decides what a complete request head gets, for a server of `path`.
pub(crate) fn answer(head: &[u8], path: &str) -> Answer {
    let Some(line) = head
        .split(|&b| b == b'\n')
        .map(trim_cr)
        .find(|l| !l.is_empty())
    else {
        return Answer::BadRequest;
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Answer::BadRequest;
    };
    let mut words = line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Answer::BadRequest;
    };
    match version.strip_prefix("HTTP/") {
        Some(v) if v.starts_with("1.") => {}
        Some(_) => return Answer::VersionNotSupported,
        None => return Answer::BadRequest,
    }
    if target_path(target) != path {
        return Answer::NotFound;
    }
    match method {
        "GET" => Answer::Page { body: true },
        "HEAD" => Answer::Page { body: false },
        _ => Answer::MethodNotAllowed,
    }
}

/// A reply: its head, and its body if one is sent.
struct Reply {
    head: Vec<u8>,
    body: Option<Arc<String>>,
}

fn reply(answer: Answer, page: &mut Page) -> Reply {
    let text = |status: &str, body: String, extra: &str| {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
            body.len()
        );
        Reply {
            head: head.into_bytes(),
            body: Some(Arc::new(body)),
        }
    };
    let path = page.path;
    match answer {
        Answer::Page { body } => {
            let page_body = (page.render)();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                page.content_type,
                page_body.len()
            );
            Reply {
                head: head.into_bytes(),
                body: body.then_some(page_body),
            }
        }
        Answer::NotFound => text(
            "404 Not Found",
            format!("not found: only {path} is served here\n"),
            "",
        ),
        Answer::MethodNotAllowed => text(
            "405 Method Not Allowed",
            format!("use GET or HEAD {path}\n"),
            "Allow: GET, HEAD\r\n",
        ),
        Answer::BadRequest => text(
            "400 Bad Request",
            format!("not an HTTP/1.x request line; use GET {path} HTTP/1.1\n"),
            "",
        ),
        Answer::VersionNotSupported => text(
            "505 HTTP Version Not Supported",
            "only HTTP/1.x is served here\n".into(),
            "",
        ),
        Answer::HeadTooLarge => text(
            "431 Request Header Fields Too Large",
            format!("the request head is over {MAX_HEAD} bytes\n"),
            "",
        ),
        Answer::Timeout => text(
            "408 Request Timeout",
            format!(
                "the request head did not arrive within {} s\n",
                HEAD_TIMEOUT.as_secs()
            ),
            "",
        ),
    }
}

/// Where a connection stands.
enum State {
    Reading(Vec<u8>),
    Writing { reply: Reply, sent: usize },
    Draining { dropped: usize },
}

struct Conn {
    stream: TcpStream,
    accepted: Instant,
    deadline: Instant,
    state: State,
}

/// Whether to keep a connection after serving it.
#[derive(PartialEq, Eq)]
enum Step {
    Keep,
    Close,
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

impl Conn {
    fn events(&self) -> PollFlags {
        match self.state {
            State::Writing { .. } => PollFlags::OUT,
            State::Reading(_) | State::Draining { .. } => PollFlags::IN,
        }
    }

    /// Does what the connection is ready for (`revents` from poll).
    fn serve(&mut self, revents: PollFlags, page: &mut Page, now: Instant) -> Step {
        if revents.is_empty() {
            return Step::Keep;
        }
        match self.state {
            State::Reading(_) => self.read_head(page, now),
            State::Writing { .. } => self.write_reply(now),
            State::Draining { .. } => self.drain(),
        }
    }

    fn read_head(&mut self, page: &mut Page, now: Instant) -> Step {
        let State::Reading(buf) = &mut self.state else {
            return Step::Keep;
        };
        let mut chunk = [0u8; 2048];
        let verdict = loop {
            let room = (MAX_HEAD + 1 - buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => return Step::Close,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if would_block(&e) => return Step::Keep,
                Err(_) => return Step::Close,
            }
            if let Some(end) = head_end(buf) {
                break answer(&buf[..end], page.path);
            }
            if buf.len() > MAX_HEAD {
                break Answer::HeadTooLarge;
            }
        };
        self.respond(verdict, page, now)
    }

    fn respond(&mut self, answer: Answer, page: &mut Page, now: Instant) -> Step {
        self.state = State::Writing {
            reply: reply(answer, page),
            sent: 0,
        };
        self.deadline = now + WRITE_TIMEOUT;
        self.write_reply(now)
    }

    fn write_reply(&mut self, now: Instant) -> Step {
        let State::Writing { reply, sent } = &mut self.state else {
            return Step::Keep;
        };
        let body = reply.body.as_deref().map_or(&[][..], String::as_bytes);
        loop {
            let rest = match reply.head.get(*sent..) {
                Some(r) if !r.is_empty() => r,
                _ => &body[*sent - reply.head.len()..],
            };
            if rest.is_empty() {
                break;
            }
            match self.stream.write(rest) {
                Ok(0) => return Step::Close,
                Ok(n) => *sent += n,
                Err(e) if would_block(&e) => return Step::Keep,
                Err(_) => return Step::Close,
            }
        }
        if self.stream.shutdown(Shutdown::Write).is_err() {
            return Step::Close;
        }
        self.state = State::Draining { dropped: 0 };
        self.deadline = now + DRAIN_TIMEOUT;
        self.drain()
    }

    fn drain(&mut self) -> Step {
        let State::Draining { dropped } = &mut self.state else {
            return Step::Keep;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Step::Close,
                Ok(n) if *dropped + n > MAX_DRAIN => return Step::Close,
                Ok(n) => *dropped += n,
                Err(e) if would_block(&e) => return Step::Keep,
                Err(_) => return Step::Close,
            }
        }
    }

    /// Past its deadline: a head still unfinished gets a best-effort 408.
    fn expire(&mut self, page: &mut Page) {
        if let State::Reading(_) = self.state {
            let r = reply(Answer::Timeout, page);
            let body = r.body.as_deref().map_or("", String::as_str);
            let _ = self
                .stream
                .write_all(&[r.head, body.as_bytes().to_vec()].concat());
        }
    }
}

/// The server thread's state.
struct Loop {
    listener: TcpListener,
    stop: OwnedFd,
    page: Page,
    conns: Vec<Conn>,
    accept_paused_until: Option<Instant>,
}

impl Loop {
    fn run(mut self) -> Result<(), Error> {
        // What poll found for the stop eventfd, the listener, then each connection.
        let mut ready: Vec<PollFlags> = Vec::with_capacity(MAX_CONNECTIONS + 2);
        loop {
            let now = Instant::now();
            if self.accept_paused_until.is_some_and(|t| t <= now) {
                self.accept_paused_until = None;
            }
            let accepting = self.accept_paused_until.is_none();
            let timeout = self.poll_timeout(now);
            let mut fds = Vec::with_capacity(self.conns.len() + 2);
            fds.push(PollFd::new(&self.stop, PollFlags::IN));
            let listening = if accepting {
                PollFlags::IN
            } else {
                PollFlags::empty()
            };
            fds.push(PollFd::new(&self.listener, listening));
            fds.extend(
                self.conns
                    .iter()
                    .map(|c| PollFd::new(&c.stream, c.events())),
            );
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    log::warn!("metrics: poll failed, serving stops: {e}");
                    return Err(Error::Poll(e.into()));
                }
            }
            ready.clear();
            ready.extend(fds.iter().map(PollFd::revents));
            drop(fds);
            if !ready[0].is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            self.serve_connections(&ready[2..], now);
            if !ready[1].is_empty() {
                self.accept_all(now);
            }
        }
    }

    /// Time until the next deadline (rounded up to a millisecond, as poll
    /// takes it), or `None` for none.
    fn poll_timeout(&self, now: Instant) -> Option<Timespec> {
        let next = self
            .conns
            .iter()
            .map(|c| c.deadline)
            .chain(self.accept_paused_until)
            .min()?;
        let ms = next
            .saturating_duration_since(now)
            .as_micros()
            .div_ceil(1000);
        let ms = i64::try_from(ms).unwrap_or(i64::MAX / 1_000_000);
        Some(Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        })
    }

    /// Serves each connection poll found ready, and drops those past their
    /// deadline. `ready[i]` belongs to `conns[i]`.
    fn serve_connections(&mut self, ready: &[PollFlags], now: Instant) {
        let page = &mut self.page;
        let mut i = 0;
        self.conns.retain_mut(|c| {
            let revents = ready.get(i).copied().unwrap_or(PollFlags::empty());
            i += 1;
            if c.serve(revents, page, now) == Step::Close {
                return false;
            }
            if c.deadline <= now {
                c.expire(page);
                return false;
            }
            true
        });
    }

    fn accept_all(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if self.conns.len() >= MAX_CONNECTIONS {
                        self.evict_oldest();
                    }
                    self.conns.push(Conn {
                        stream,
                        accepted: now,
                        deadline: now + HEAD_TIMEOUT,
                        state: State::Reading(Vec::new()),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    log::warn!("metrics: accept failed, pausing accepts: {e}");
                    self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Makes room by closing the connection accepted first: the one that has
    /// had the most time to send its request.
    fn evict_oldest(&mut self) {
        let oldest = self
            .conns
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.accepted)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            log::debug!("metrics: {MAX_CONNECTIONS} connections open, closing the oldest");
            self.conns.swap_remove(i);
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
