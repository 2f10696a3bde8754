//! The destination's wait for its source. Every peer that connects to
//! `--incoming` is accepted at once and read together with the others
//! (nonblocking, one poll over all of them), each with [`HEADER_WAIT`] from
//! its connection for its whole 16-byte stream header. The first peer whose
//! header is a source's wins; the rest are dropped with the listener. So a
//! peer that says nothing, or dribbles, costs a slot for [`HEADER_WAIT`] at
//! most and never delays a source behind it.
//!
//! A peer is dropped as soon as its first bytes differ from the stream's
//! magic (a health check, a port scan), when it hangs up, or when its
//! deadline passes; at most [`MAX_PENDING`] peers wait at once, and one more
//! drops the one waiting longest. A header with the magic but another
//! version is a source this build cannot read: it is refused, and the wait ends.

use std::collections::VecDeque;
use std::io::Read;
use std::time::{Duration, Instant};

use zerocopy::FromBytes;

use super::format::{self, StreamHeader};
use super::inbound::{Listener, Stop};
use super::transport::{self, Conn, TICK};
use crate::units::format_duration;

/// How long a peer has, from its connection, to send its whole stream header.
pub const HEADER_WAIT: Duration = Duration::from_secs(5);
/// Peers waited on at once; one more drops the one waiting longest.
pub const MAX_PENDING: usize = 64;
/// The stream header's size.
pub const HEADER_LEN: usize = size_of::<StreamHeader>();

/// Why no source was taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Polling or accepting failed.
    #[error(transparent)]
    Transport(#[from] transport::Error),
    /// Polling the listener and the peers failed (the URI given).
    #[error("waiting for the source on {0}")]
    Poll(String, #[source] std::io::Error),
    /// A source sent a header this build refuses (another version).
    #[error("the source's stream header")]
    Header(#[source] format::Error),
    /// The destination was told to stop (by whom, the URI).
    #[error("stopped by {0} while waiting for the source on {1}")]
    Stopped(String, String),
}

/// What a peer's first bytes say so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fewer than [`HEADER_LEN`] bytes, all matching a source's so far.
    More,
    /// Not a migration source (its bytes so far are not the magic).
    NotASource,
    /// A whole header this build reads.
    Source,
    /// A source's magic with a version this build does not read.
    Version(u32),
}

/// A peer's stream header as it arrives, in pieces of any size.
#[derive(Debug, Default, Clone)]
pub struct HeaderBuf {
    bytes: [u8; HEADER_LEN],
    len: usize,
}

impl HeaderBuf {
    /// Takes what the header still lacks from `data`; returns how much it took.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(HEADER_LEN - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&data[..n]);
        self.len += n;
        n
    }

    /// The header's bytes so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// What the bytes so far say.
    pub fn verdict(&self) -> Verdict {
        let magic = self.len.min(format::MAGIC.len());
        if self.bytes[..magic] != format::MAGIC[..magic] {
            return Verdict::NotASource;
        }
        match StreamHeader::read_from_bytes(self.bytes()) {
            Err(_) => Verdict::More,
            Ok(h) if h.version == format::VERSION => Verdict::Source,
            Ok(h) => Verdict::Version(h.version),
        }
    }
}

/// A peer that has not sent its whole header yet.
struct Peer {
    conn: Conn,
    header: HeaderBuf,
    since: Instant,
}

impl Peer {
    /// Reads what has arrived; `Err` with why the peer is dropped.
    fn read(&mut self) -> Result<Verdict, &'static str> {
        let mut buf = [0u8; HEADER_LEN];
        let want = HEADER_LEN - self.header.len;
        match self.conn.read(&mut buf[..want]) {
            Ok(0) => Err("it hung up"),
            Ok(n) => {
                self.header.push(&buf[..n]);
                Ok(self.header.verdict())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Verdict::More),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Verdict::More),
            Err(_) => Err("reading from it failed"),
        }
    }
}

/// The peers waited on, oldest first.
struct Waiting {
    peers: VecDeque<Peer>,
    uri: String,
    /// Peers dropped so far (logged once, when the wait ends).
    dropped: u64,
}

impl Waiting {
    fn drop_peer(&mut self, i: usize, why: &str) {
        self.peers.remove(i);
        self.dropped += 1;
        log::debug!(
            "{}: dropped a peer that is not a migration source ({why})",
            self.uri
        );
    }

    /// Drops the peers whose header deadline has passed; returns the next deadline.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        let late = format!("no stream header within {}", format_duration(HEADER_WAIT));
        while self
            .peers
            .front()
            .is_some_and(|p| now >= p.since + HEADER_WAIT)
        {
            self.drop_peer(0, &late);
        }
        self.peers.front().map(|p| p.since + HEADER_WAIT)
    }

    /// Takes the connections waiting at the listener, at most
    /// [`MAX_PENDING`] per round, so that a flood cannot keep the wait from
    /// reading the peers it has.
    fn accept_all(&mut self, listener: &Listener) -> Result<(), Error> {
        for _ in 0..MAX_PENDING {
            let Some(conn) = listener.try_accept()? else {
                break;
            };
            if self.peers.len() == MAX_PENDING {
                self.drop_peer(0, "more peers than the destination waits on");
            }
            self.peers.push_back(Peer {
                conn,
                header: HeaderBuf::default(),
                since: Instant::now(),
            });
        }
        Ok(())
    }

    /// Polls the listener and every peer, until `deadline` or a tick.
    /// Returns whether the listener is readable, and which peers are.
    fn poll(
        &self,
        listener: &Listener,
        deadline: Option<Instant>,
    ) -> Result<(bool, Vec<bool>), Error> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let wait = deadline.map_or(TICK, |d| {
            d.saturating_duration_since(Instant::now()).min(TICK)
        });
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(listener, PollFlags::IN))
            .chain(
                self.peers
                    .iter()
                    .map(|p| PollFd::new(&p.conn, PollFlags::IN)),
            )
            .collect();
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok((false, vec![false; self.peers.len()])),
            Err(e) => return Err(Error::Poll(self.uri.clone(), e.into())),
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        Ok((ready[0], ready[1..].to_vec()))
    }

    /// Reads the peers `ready` marks; the first source's connection and header.
    fn read_ready(&mut self, ready: &[bool]) -> Result<Option<(Conn, HeaderBuf)>, Error> {
        // Backwards, so that dropping a peer leaves the others' indices alone.
        for i in (0..ready.len()).rev().filter(|&i| ready[i]) {
            match self.peers[i].read() {
                Ok(Verdict::More) => {}
                Ok(Verdict::Source) => {
                    let p = self
                        .peers
                        .remove(i)
                        .ok_or_else(|| unreachable_peer(&self.uri))?;
                    return Ok(Some((p.conn, p.header)));
                }
                Ok(Verdict::NotASource) => self.drop_peer(i, "not the stream's magic"),
                Ok(Verdict::Version(_)) => {
                    let mut p = self
                        .peers
                        .remove(i)
                        .ok_or_else(|| unreachable_peer(&self.uri))?;
                    let e = format::Reader::start(p.header.bytes())
                        .err()
                        .unwrap_or(format::Error::Truncated("the stream header"));
                    let _ = p.conn.set_nonblocking(false);
                    let _ = p.conn.set_write_timeout(Some(TICK));
                    let _ = format::write_reply(
                        &mut p.conn,
                        format::REPLY_REFUSED,
                        &crate::error_chain(&e),
                    );
                    return Err(Error::Header(e));
                }
                Err(why) => self.drop_peer(i, why),
            }
        }
        Ok(None)
    }
}

/// A peer index that `ready` named but the set lacks (cannot happen: both
/// come from the same set, unchanged in between).
fn unreachable_peer(uri: &str) -> Error {
    Error::Poll(
        uri.to_string(),
        std::io::Error::other("a polled peer is gone"),
    )
}

/// Waits at `listener` for a source: its connection (nonblocking) and its
/// header. `stop` is looked at every [`TICK`].
///
/// # Errors
/// Polling or accepting failed, a source's header was refused (it was told
/// why), or `stop` said to stop.
pub(crate) fn wait(
    listener: &Listener,
    uri: &str,
    stop: &Stop,
) -> Result<(Conn, HeaderBuf), Error> {
    listener.set_nonblocking()?;
    let mut w = Waiting {
        peers: VecDeque::new(),
        uri: uri.to_string(),
        dropped: 0,
    };
    let found = loop {
        if let Some(why) = stop() {
            break Err(Error::Stopped(why, w.uri.clone()));
        }
        let deadline = w.expire(Instant::now());
        let (incoming, ready) = w.poll(listener, deadline)?;
        match w.read_ready(&ready) {
            Ok(None) => {}
            Ok(Some(f)) => break Ok(f),
            Err(e) => break Err(e),
        }
        if incoming {
            w.accept_all(listener)?;
        }
    };
    if w.dropped > 0 {
        log::warn!(
            "{uri}: dropped {} peers that were not migration sources (a wrong first byte, \
             no header within {}, hung up, or over {MAX_PENDING} waiting)",
            w.dropped,
            format_duration(HEADER_WAIT)
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(version: u32) -> Vec<u8> {
        let mut h = format::MAGIC.to_vec();
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    }

    #[test]
    fn a_header_in_pieces_is_judged_as_a_whole_one() {
        let whole = header(format::VERSION);
        let mut h = HeaderBuf::default();
        for (i, b) in whole.iter().enumerate() {
            assert_eq!(h.verdict(), Verdict::More, "after {i} bytes");
            assert_eq!(h.push(std::slice::from_ref(b)), 1);
        }
        assert_eq!(h.verdict(), Verdict::Source);
        assert_eq!(h.push(b"more"), 0, "nothing past the header is taken");
        assert_eq!(h.bytes(), &whole[..]);
    }

    #[test]
    fn a_peer_is_judged_not_a_source_at_its_first_wrong_byte() {
        let mut h = HeaderBuf::default();
        h.push(b"GET / HTTP/1.0\r\n");
        assert_eq!(h.verdict(), Verdict::NotASource);
        let mut h = HeaderBuf::default();
        h.push(b"KVMSX");
        assert_eq!(h.verdict(), Verdict::NotASource);
    }

    /// A listener on a unix socket of its own (the file goes with the listener).
    fn listener(test: &str) -> (Listener, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "kvmscope-handshake-{}-{test}.sock",
            std::process::id()
        ));
        let l = Listener::bind(&transport::Uri::Unix(path.clone())).unwrap();
        (l, path)
    }

    #[test]
    fn a_source_behind_more_idle_peers_than_the_bound_is_taken_at_once() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let (l, path) = listener("idle");
        let idle: Vec<UnixStream> = (0..MAX_PENDING + 10)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let mut dribbler = UnixStream::connect(&path).unwrap();
        dribbler.write_all(&header(format::VERSION)[..5]).unwrap();
        let mut source = UnixStream::connect(&path).unwrap();
        source.write_all(&header(format::VERSION)).unwrap();
        source.write_all(b"config").unwrap();
        let never: Stop = std::sync::Arc::new(|| None);
        let started = Instant::now();
        let (mut conn, h) = wait(&l, "unix:test", &never).unwrap();
        assert!(
            started.elapsed() < HEADER_WAIT,
            "no peer's deadline was waited out"
        );
        assert_eq!(h.bytes(), &header(format::VERSION)[..]);
        conn.set_nonblocking(false).unwrap();
        let mut rest = [0u8; 6];
        conn.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"config", "nothing past the header was read");
        drop(idle);
    }

    #[test]
    fn a_stop_ends_the_wait_naming_who_asked() {
        let (l, path) = listener("stop");
        let _idle = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let stop: Stop = std::sync::Arc::new(|| Some("signal 15".to_string()));
        let e = wait(&l, "unix:test", &stop).map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stopped by signal 15 while waiting for the source on unix:test"
        );
    }

    proptest! {
        #[test]
        fn pieces_of_any_size_get_the_verdict_of_the_whole(
            data in proptest::collection::vec(any::<u8>(), 0..40),
            magic_prefix in 0usize..=8,
            step in 1usize..=16,
        ) {
            // Often a source's magic, then anything.
            let mut bytes = format::MAGIC[..magic_prefix].to_vec();
            bytes.extend_from_slice(&data);
            let mut h = HeaderBuf::default();
            for piece in bytes.chunks(step) {
                h.push(piece);
                if h.verdict() != Verdict::More {
                    break;
                }
            }
            let mut whole = HeaderBuf::default();
            whole.push(&bytes[..h.bytes().len()]);
            prop_assert_eq!(whole.verdict(), h.verdict());
            prop_assert_eq!(
                h.verdict() == Verdict::Source,
                format::Reader::start(h.bytes()).is_ok()
            );
        }
    }

    #[test]
    fn another_version_is_named() {
        let mut h = HeaderBuf::default();
        h.push(&header(7));
        assert_eq!(h.verdict(), Verdict::Version(7));
    }
}
