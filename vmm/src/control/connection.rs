//! One client connection: its input split into JSON values as they complete
//! (`protocol::framing`), its negotiation state, and its output queued with
//! the fds that ride on it, sent as the socket accepts it.
//!
//! Nothing here blocks: the socket is non-blocking, input is read one bounded
//! chunk per readiness event, and output that the client does not take stays
//! queued. While a reply is being sent, no further request of the client is
//! run (so one reply of any size can be in flight, but a client that does not
//! read cannot make the queue grow); events still queue, up to a cap past
//! which the client is dropped.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::limits::{MAX_QUEUED_BYTES, MAX_QUEUED_FDS};
use crate::protocol::framing::{Frame, Framer};
use crate::scm::{self, MAX_FDS_PER_MESSAGE};

/// Bytes read from a client per readiness event.
const READ_CHUNK: usize = 16 << 10;

/// Part of a reply line, with the fds that go with its first byte.
struct Chunk {
    bytes: Vec<u8>,
    sent: usize,
    fds: Vec<File>,
    /// An event line (dropped first when the client reads too slowly).
    event: bool,
}

/// What reading from the client gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// Some bytes (maybe a request, maybe part of one).
    Data,
    /// Nothing now.
    Empty,
    /// The client will send no more.
    End,
}

/// A client connection.
pub(crate) struct Connection {
    stream: UnixStream,
    framer: Framer,
    output: VecDeque<Chunk>,
    queued_bytes: usize,
    queued_fds: usize,
    /// The client has closed its sending side.
    pub(crate) ended: bool,
    /// A reply is deferred: further requests wait until it is sent.
    pub(crate) busy: bool,
    /// `qmp_capabilities` succeeded: commands are served.
    pub(crate) negotiated: bool,
    /// When the client last sent a byte or was last sent one.
    pub(crate) last_active: Instant,
    /// When the unfinished request now waiting started arriving.
    pub(crate) partial_since: Option<Instant>,
    /// When the client connected.
    pub(crate) connected: Instant,
    /// Requests were held back (a reply pending): look again once it is sent.
    held: bool,
    /// Admitted to a reserved slot ([`super::limits::RESERVED_CLIENTS`]): served
    /// `query-status`, `query-version` and `quit` only.
    pub(crate) reserved: bool,
    /// The peer's process (its socket's credentials, read at admission),
    /// when known.
    pub(crate) peer_pid: Option<u32>,
}

impl Connection {
    /// Wraps an accepted, non-blocking stream.
    pub(crate) fn new(stream: UnixStream) -> Connection {
        Connection {
            stream,
            framer: Framer::new(),
            output: VecDeque::new(),
            queued_bytes: 0,
            queued_fds: 0,
            ended: false,
            busy: false,
            negotiated: false,
            last_active: Instant::now(),
            partial_since: None,
            connected: Instant::now(),
            held: false,
            reserved: false,
            peer_pid: None,
        }
    }

    /// Reads one chunk of what the client sent.
    ///
    /// # Errors
    /// The read failure (the client is then dropped).
    pub(crate) fn read(&mut self) -> io::Result<Input> {
        let mut buf = [0u8; READ_CHUNK];
        // With room for the most fds a message carries: fds a client sends
        // are taken here (and closed, without lingering, when `sent` goes),
        // not by the kernel on a plain read, which would close them on this
        // thread's return from it, a socket with SO_LINGER blocking the
        // control thread for as long as it sets.
        let mut sent = Vec::new();
        let got = loop {
            match scm::recv_with_fds(&self.stream, &mut buf, &mut sent, MAX_FDS_PER_MESSAGE) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        drop(sent);
        match got {
            Ok(0) => {
                self.ended = true;
                Ok(Input::End)
            }
            Ok(n) => {
                self.framer.extend(&buf[..n]);
                self.last_active = Instant::now();
                Ok(Input::Data)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Input::Empty),
            Err(e) => Err(e),
        }
    }

    /// The next complete request (or framing error), unless a reply is
    /// deferred or still being sent. At end of stream, a trailing scalar
    /// token is complete.
    pub(crate) fn next_frame(&mut self) -> Option<Frame> {
        if self.busy || self.replying() {
            // Requests waiting behind a reply are back-pressure, not an
            // unfinished request: no deadline runs while the server holds them.
            self.held = true;
            self.partial_since = None;
            return None;
        }
        self.held = false;
        let frame = self.framer.next_frame(self.ended);
        // Only when no frame could be cut is what is left an unfinished
        // request; after a frame, the rest may be whole requests queued.
        self.partial_since = match (frame.is_none() && self.framer.partial(), self.partial_since) {
            (false, _) => None,
            (true, since) => Some(since.unwrap_or_else(Instant::now)),
        };
        frame
    }

    /// True when the client has sent something the server has not acted on:
    /// bytes in the framer, or bytes in the socket not yet read.
    pub(crate) fn has_pending_input(&self) -> bool {
        if self.framer.partial() {
            return true;
        }
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        matches!(rustix::net::recv(&self.stream, &mut byte, flags), Ok((_, n)) if n > 0)
    }

    /// True when a reply has gone out in part: closing now must not add a
    /// byte after it (an error line there would make the line not JSON).
    pub(crate) fn mid_line(&self) -> bool {
        self.output.front().is_some_and(|c| c.sent > 0)
    }

    /// True when the client's input should be read now: it may send more,
    /// and nothing it asked for is still pending or being sent.
    pub(crate) fn wants_input(&self) -> bool {
        !self.busy && !self.ended && !self.replying()
    }

    /// True when output has waited since before `since` (the client does not read).
    pub(crate) fn stalled_since(&self, since: Instant) -> bool {
        self.has_output() && self.last_active < since
    }

    /// Forgets queued output (the client is gone, or is being closed).
    pub(crate) fn discard_output(&mut self) {
        // Gives the memory back, not just the length.
        self.output = VecDeque::new();
        self.queued_bytes = 0;
        self.queued_fds = 0;
    }

    /// True once requests held back behind a reply may run: the reply is sent.
    pub(crate) fn take_ready_held(&mut self) -> bool {
        let ready = self.held && !self.busy && !self.replying();
        if ready {
            self.held = false;
        }
        ready
    }

    /// True while part of a reply (not an event) waits to be sent.
    fn replying(&self) -> bool {
        self.output.iter().any(|c| !c.event)
    }

    /// Queues a reply line (`line` ends with a newline) with its fds. Past
    /// [`MAX_FDS_PER_MESSAGE`] fds, the line goes in several messages, each
    /// carrying one byte of it and the next batch of fds, the last the rest.
    pub(crate) fn queue(&mut self, line: Vec<u8>, fds: Vec<File>) {
        self.push(line, fds, false);
    }

    /// Queues an event line.
    pub(crate) fn queue_event(&mut self, line: Vec<u8>) {
        self.push(line, Vec::new(), true);
    }

    fn push(&mut self, mut line: Vec<u8>, mut fds: Vec<File>, event: bool) {
        self.queued_bytes += line.len();
        self.queued_fds += fds.len();
        while fds.len() > MAX_FDS_PER_MESSAGE && line.len() > 1 {
            let rest = fds.split_off(MAX_FDS_PER_MESSAGE);
            let tail = line.split_off(1);
            self.output.push_back(Chunk {
                bytes: line,
                sent: 0,
                fds,
                event,
            });
            (line, fds) = (tail, rest);
        }
        self.output.push_back(Chunk {
            bytes: line,
            sent: 0,
            fds,
            event,
        });
    }

    /// True when the client has more output waiting than it may: one reply
    /// of any size may be in flight, but events piling up behind it (a
    /// subscriber that does not read) or fds not taken count against the cap.
    pub(crate) fn over_limit(&self) -> bool {
        let reply: usize = self
            .output
            .iter()
            .filter(|c| !c.event)
            .map(|c| c.bytes.len() - c.sent)
            .sum();
        self.queued_bytes - reply > MAX_QUEUED_BYTES || self.queued_fds > MAX_QUEUED_FDS
    }

    /// Bytes queued and not yet sent (replies and events).
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// True while output is waiting for the client to read it.
    pub(crate) fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Sends queued output until it is all sent or the socket is full.
    ///
    /// # Errors
    /// The send failure (EPIPE when the client went away: it is then dropped).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        while let Some(chunk) = self.output.front_mut() {
            let fds: Vec<BorrowedFd<'_>> = chunk.fds.iter().map(AsFd::as_fd).collect();
            match scm::send_with_fds(&self.stream, &chunk.bytes[chunk.sent..], &fds) {
                Ok(n) => {
                    self.last_active = Instant::now();
                    chunk.sent += n;
                    self.queued_bytes -= n;
                    // The fds went with the first byte sent; close our copies.
                    self.queued_fds -= chunk.fds.len();
                    chunk.fds.clear();
                    if chunk.sent == chunk.bytes.len() {
                        self.output.pop_front();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The stream, for registering with epoll.
    pub(crate) fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn pair() -> (Connection, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (Connection::new(a), b)
    }

    fn value(s: &str) -> Option<Frame> {
        Some(Frame::Value(s.as_bytes().to_vec()))
    }

    #[test]
    fn requests_complete_at_their_closing_brace_across_reads() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"{\"a\":1}{\"b\"").unwrap();
        assert_eq!(c.read().unwrap(), Input::Data);
        assert_eq!(c.next_frame(), value("{\"a\":1}"));
        assert_eq!(c.next_frame(), None);
        assert!(c.partial_since.is_some());
        peer.write_all(b":2}").unwrap();
        c.read().unwrap();
        assert_eq!(c.next_frame(), value("{\"b\":2}"));
        assert_eq!(c.next_frame(), None);
        assert!(c.partial_since.is_none());
    }

    #[test]
    fn busy_or_replying_connection_holds_its_requests() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"{}{}").unwrap();
        c.read().unwrap();
        c.busy = true;
        assert_eq!(c.next_frame(), None);
        c.busy = false;
        c.queue(b"{\"return\":{}}\n".to_vec(), Vec::new());
        assert_eq!(c.next_frame(), None, "a reply is still queued");
        c.queue_event(b"{\"event\":\"X\"}\n".to_vec());
        c.flush().unwrap();
        assert_eq!(c.next_frame(), value("{}"));
    }

    #[test]
    fn end_of_stream_is_reported() {
        let (mut c, peer) = pair();
        drop(peer);
        assert_eq!(c.read().unwrap(), Input::End);
        assert!(c.ended);
    }

    #[test]
    fn one_reply_over_the_cap_is_not_over_the_limit_but_piled_events_are() {
        let (mut c, _peer) = pair();
        c.queue(vec![b'x'; MAX_QUEUED_BYTES * 2], Vec::new());
        assert!(!c.over_limit());
        while !c.over_limit() {
            c.queue_event(vec![b'e'; 64 << 10]);
        }
        assert!(c.has_output());
    }

    #[test]
    fn queued_fds_are_split_into_kernel_sized_messages() {
        let (mut c, peer) = pair();
        let file = File::open("/proc/self/stat").unwrap();
        let fds: Vec<File> = (0..MAX_FDS_PER_MESSAGE + 2)
            .map(|_| file.try_clone().unwrap())
            .collect();
        c.queue(b"{\"return\":{}}\n".to_vec(), fds);
        c.flush().unwrap();
        assert!(!c.has_output());
        let (mut got, mut bytes) = (Vec::new(), Vec::new());
        while !bytes.ends_with(b"\n") {
            let mut buf = [0u8; 64];
            let n = scm::recv_with_fds(&peer, &mut buf, &mut got, MAX_FDS_PER_MESSAGE).unwrap();
            bytes.extend_from_slice(&buf[..n]);
        }
        assert_eq!(
            (bytes.as_slice(), got.len()),
            (&b"{\"return\":{}}\n"[..], MAX_FDS_PER_MESSAGE + 2)
        );
    }

    #[test]
    fn flush_to_a_closed_peer_fails() {
        let (mut c, peer) = pair();
        drop(peer);
        c.queue(b"x\n".to_vec(), Vec::new());
        assert!(c.flush().is_err());
    }
}
