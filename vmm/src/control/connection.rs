//! One client connection: its input split into lines, and its output queued
//! with the fds that ride on it, sent as the socket accepts it.
//!
//! Nothing here blocks: the socket is non-blocking, input is read one bounded
//! chunk per readiness event, and output that the client does not take stays
//! queued, up to a cap past which the client is dropped.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use super::scm::{self, MAX_FDS_PER_MESSAGE};
use super::{MAX_LINE, MAX_QUEUED_BYTES, MAX_QUEUED_FDS};

/// Bytes read from a client per readiness event.
const READ_CHUNK: usize = 16 << 10;

/// Part of a reply line, with the fds that go with its first byte.
struct Chunk {
    bytes: Vec<u8>,
    sent: usize,
    fds: Vec<File>,
}

/// What reading from the client gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// Some bytes (maybe a line, maybe part of one).
    Data,
    /// Nothing now.
    Empty,
    /// The client will send no more.
    End,
}

/// A line from the client, or the reason there can be no more.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Complete(Vec<u8>),
    TooLong,
}

/// A client connection.
pub struct Connection {
    stream: UnixStream,
    input: Vec<u8>,
    /// Bytes of `input` already searched for a newline.
    scanned: usize,
    output: VecDeque<Chunk>,
    queued_bytes: usize,
    queued_fds: usize,
    /// The client has closed its sending side.
    pub ended: bool,
    /// A reply is deferred: further lines wait until it is sent.
    pub busy: bool,
}

impl Connection {
    /// Wraps an accepted, non-blocking stream.
    pub fn new(stream: UnixStream) -> Connection {
        Connection {
            stream,
            input: Vec::new(),
            scanned: 0,
            output: VecDeque::new(),
            queued_bytes: 0,
            queued_fds: 0,
            ended: false,
            busy: false,
        }
    }

    /// Reads one chunk of what the client sent.
    ///
    /// # Errors
    /// The read failure (the client is then dropped).
    pub fn read(&mut self) -> io::Result<Input> {
        let start = self.input.len();
        self.input.resize(start + READ_CHUNK, 0);
        let got = loop {
            match self.stream.read(&mut self.input[start..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        self.input.truncate(start + *got.as_ref().unwrap_or(&0));
        match got {
            Ok(0) => {
                self.ended = true;
                Ok(Input::End)
            }
            Ok(_) => Ok(Input::Data),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Input::Empty),
            Err(e) => Err(e),
        }
    }

    /// The next complete line (newline removed), unless a reply is deferred.
    /// `TooLong` once the client has sent more than [`MAX_LINE`] bytes
    /// without a newline. At end of stream, what is left is the last line.
    pub fn next_line(&mut self) -> Option<Line> {
        if self.busy {
            return None;
        }
        match self.input[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(i) => {
                let end = self.scanned + i;
                self.scanned = 0;
                if end > MAX_LINE {
                    return Some(Line::TooLong);
                }
                let mut line: Vec<u8> = self.input.drain(..=end).collect();
                line.pop();
                Some(Line::Complete(line))
            }
            None if self.input.len() > MAX_LINE => Some(Line::TooLong),
            // The client ended without a final newline: its last line is complete.
            None if self.ended && !self.input.is_empty() => {
                self.scanned = 0;
                Some(Line::Complete(std::mem::take(&mut self.input)))
            }
            None => {
                self.scanned = self.input.len();
                None
            }
        }
    }

    /// Queues a reply line (`line` ends with a newline) with its fds. Past
    /// [`MAX_FDS_PER_MESSAGE`] fds, the line goes in several messages, each
    /// carrying one byte of it and the next batch of fds, the last the rest.
    pub fn queue(&mut self, mut line: Vec<u8>, mut fds: Vec<File>) {
        self.queued_bytes += line.len();
        self.queued_fds += fds.len();
        while fds.len() > MAX_FDS_PER_MESSAGE && line.len() > 1 {
            let rest = fds.split_off(MAX_FDS_PER_MESSAGE);
            let tail = line.split_off(1);
            self.output.push_back(Chunk {
                bytes: line,
                sent: 0,
                fds,
            });
            (line, fds) = (tail, rest);
        }
        self.output.push_back(Chunk {
            bytes: line,
            sent: 0,
            fds,
        });
    }

    /// True when the client has more output waiting than it may.
    pub fn over_limit(&self) -> bool {
        self.queued_bytes > MAX_QUEUED_BYTES || self.queued_fds > MAX_QUEUED_FDS
    }

    /// True while output is waiting for the client to read it.
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Sends queued output until it is all sent or the socket is full.
    ///
    /// # Errors
    /// The send failure (EPIPE when the client went away: it is then dropped).
    pub fn flush(&mut self) -> io::Result<()> {
        while let Some(chunk) = self.output.front_mut() {
            let fds: Vec<BorrowedFd<'_>> = chunk.fds.iter().map(AsFd::as_fd).collect();
            match scm::send_with_fds(&self.stream, &chunk.bytes[chunk.sent..], &fds) {
                Ok(n) => {
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
    pub fn stream(&self) -> &UnixStream {
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

    #[test]
    fn lines_split_at_newlines_across_reads() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"{\"a\":1}\n{\"b\"").unwrap();
        assert_eq!(c.read().unwrap(), Input::Data);
        assert_eq!(c.next_line(), Some(Line::Complete(b"{\"a\":1}".to_vec())));
        assert_eq!(c.next_line(), None);
        peer.write_all(b":2}\n").unwrap();
        c.read().unwrap();
        assert_eq!(c.next_line(), Some(Line::Complete(b"{\"b\":2}".to_vec())));
    }

    #[test]
    fn last_line_without_newline_counts_at_end_of_stream() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"a\nb").unwrap();
        drop(peer);
        while c.read().unwrap() == Input::Data {}
        assert_eq!(c.next_line(), Some(Line::Complete(b"a".to_vec())));
        assert_eq!(c.next_line(), Some(Line::Complete(b"b".to_vec())));
        assert_eq!(c.next_line(), None);
    }

    #[test]
    fn busy_connection_holds_its_lines() {
        let (mut c, mut peer) = pair();
        peer.write_all(b"x\n").unwrap();
        c.read().unwrap();
        c.busy = true;
        assert_eq!(c.next_line(), None);
        c.busy = false;
        assert_eq!(c.next_line(), Some(Line::Complete(b"x".to_vec())));
    }

    #[test]
    fn line_over_the_limit_without_newline_is_too_long() {
        let (mut c, mut peer) = pair();
        // Fits the socket buffer (over 200 KiB on Linux), so no reader is needed.
        peer.write_all(&vec![b'a'; MAX_LINE + 2]).unwrap();
        drop(peer);
        let mut verdict = None;
        while verdict.is_none() && c.read().unwrap() == Input::Data {
            verdict = c.next_line();
        }
        assert_eq!(verdict, Some(Line::TooLong));
    }

    #[test]
    fn end_of_stream_is_reported() {
        let (mut c, peer) = pair();
        drop(peer);
        assert_eq!(c.read().unwrap(), Input::End);
        assert!(c.ended);
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
    fn output_the_client_never_reads_goes_over_the_limit() {
        let (mut c, _peer) = pair();
        let line = vec![b'x'; 64 << 10];
        while !c.over_limit() {
            c.queue(line.clone(), Vec::new());
            c.flush().unwrap();
        }
        assert!(c.has_output());
    }

    #[test]
    fn flush_to_a_closed_peer_fails() {
        let (mut c, peer) = pair();
        drop(peer);
        c.queue(b"x\n".to_vec(), Vec::new());
        assert!(c.flush().is_err());
    }
}
