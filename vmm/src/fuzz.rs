//! Fuzz bodies for the VMM's parsers of outside input: control-socket request
//! lines, workload specs, migration streams and HTTP requests to `/metrics`. The cargo-fuzz targets in `fuzz/` call these, and
//! `vmm/tests/fuzz_corpus.rs` runs them over the seed corpus in `cargo test`.
//! Errors are the expected outcome for bad input; a panic is a bug.

use zerocopy::FromBytes;

use crate::migration::format::{ConfigRecord, Kind, Reader};
use crate::migration::{device, receiver};
use crate::workload::{parse_command, parse_workload};

/// Control-socket input: split into values as the server does, and each
/// parsed as a request.
pub fn control_line(data: &[u8]) {
    let mut framer = crate::protocol::framing::Framer::new();
    framer.extend(data);
    while let Some(frame) = framer.next_frame(true) {
        if let crate::protocol::framing::Frame::Value(bytes) = frame {
            let _ = crate::protocol::request::parse(&bytes);
        }
    }
}

/// A workload spec: parse it, encode every command for arenas of a few sizes,
/// and check that each command prints as a spec that parses back to itself.
pub fn workload_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(workload) = parse_workload(text) else {
        return;
    };
    for c in &workload.commands {
        for arena in [0, 4096, 64 << 20, u64::MAX] {
            let _ = c.to_guest(arena);
        }
        let printed = c.to_string();
        match parse_command(&printed) {
            Ok(back) => assert_eq!(&back, c, "'{printed}' parses back differently"),
            Err(e) => panic!("'{printed}' (printed from {c:?}) does not parse back: {e}"),
        }
    }
    let _ = workload.target.resolve(8);
}

/// A migration stream, read as a destination reads it (without a VM): the
/// header, every section within its limit, the config checked, RAM runs
/// checked against a 1 GiB guest, vCPU sections decoded, the trailer's
/// checksum and count. Returns whether the whole stream was accepted.
pub fn migration_stream(data: &[u8]) -> bool {
    let Ok(mut r) = Reader::start(data) else {
        return false;
    };
    let mut buf = Vec::new();
    loop {
        let Ok((kind, len)) = r.section() else {
            return false;
        };
        if kind == Kind::End {
            return r.finish(len).is_ok();
        }
        // A real receiver allocates up to the section limit; a fuzz input
        // that cannot hold the section need not.
        let Some(len) = usize::try_from(len).ok().filter(|&n| n <= data.len()) else {
            return false;
        };
        buf.resize(len, 0);
        if r.read_exact(&mut buf, "a section").is_err() {
            return false;
        }
        let ok = match kind {
            Kind::Config => ConfigRecord::read_from_bytes(&buf).is_ok_and(|c| {
                let given = receiver::IncomingConfig {
                    uri: crate::migration::Uri::Unix("/".into()),
                    memory: None,
                    vcpus: None,
                    hugepages: None,
                    dirty_log: None,
                    idle_timeout: receiver::DEFAULT_IDLE_TIMEOUT,
                };
                receiver::check(&c, &given).is_ok()
            }),
            Kind::Ram => receiver::runs(&buf, (1 << 30) / 4096).is_ok(),
            Kind::Plan => receiver::plan(&buf, (1 << 30) / 4096).is_ok(),
            Kind::Vcpu => device::decode(&buf).is_ok(),
            _ => true,
        };
        if !ok {
            return false;
        }
    }
}

/// A peer's first bytes at `run --incoming`, as the destination's wait
/// reads them (`migration::handshake`): the first input byte picks the size
/// of the pieces (1 to 16) the rest arrives in, the way a peer may dribble
/// its header; each piece is pushed until a verdict. That verdict must be the
/// one the same bytes get whole, and a source's header must be one
/// `format::Reader::start` accepts. Returns whether the peer is taken as a source.
pub fn migration_handshake(data: &[u8]) -> bool {
    use crate::migration::handshake::{HeaderBuf, Verdict, HEADER_LEN};
    let Some((&step, rest)) = data.split_first() else {
        return false;
    };
    let step = usize::from(step % 16) + 1;
    let mut header = HeaderBuf::default();
    let mut verdict = header.verdict();
    for piece in rest.chunks(step) {
        let taken = header.push(piece);
        assert!(taken <= piece.len() && header.bytes().len() <= HEADER_LEN);
        verdict = header.verdict();
        if verdict != Verdict::More {
            break;
        }
    }
    let mut whole = HeaderBuf::default();
    whole.push(&rest[..rest.len().min(header.bytes().len())]);
    assert_eq!(
        whole.verdict(),
        verdict,
        "pieces of {step} disagree with the whole"
    );
    let started = Reader::start(header.bytes());
    match verdict {
        Verdict::Source => assert!(started.is_ok(), "a source's header is refused"),
        Verdict::NotASource | Verdict::Version(_) => {
            assert!(started.is_err(), "a refused header starts a stream")
        }
        Verdict::More => assert!(header.bytes().len() < HEADER_LEN),
    }
    verdict == Verdict::Source
}

/// An HTTP request to a `/metrics` server, as its connections read one: where
/// the head ends (blank lines first skipped, CRLF or bare LF), and what that
/// head gets. Returns whether it gets the page.
pub fn http_request(data: &[u8]) -> bool {
    use crate::metrics::http::{answer, head_end, Answer};
    let Some(end) = head_end(data) else {
        return false;
    };
    assert!(end <= data.len(), "the head ends past the input");
    matches!(answer(&data[..end], "/metrics"), Answer::Page { .. })
}

/// What a VMM sends a client such as the exporter, arriving in pieces: the
/// first byte of `data` sets the piece size (1-64), the rest is the bytes.
/// The client reads the greeting with the exporter's line limit and then
/// every line after it; each line is decoded as a greeting, reply or event.
/// Returns whether the greeting was taken. A line is never searched twice
/// (the client keeps where it stopped), which the pieces exercise.
pub fn client_lines(data: &[u8]) -> bool {
    use crate::client::{Bounds, Client};
    let Some((&piece, bytes)) = data.split_first() else {
        return false;
    };
    let piece = usize::from(piece % 64) + 1;
    let Ok((ours, theirs)) = std::os::unix::net::UnixStream::pair() else {
        return false;
    };
    let bytes = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut theirs = theirs;
        for chunk in bytes.chunks(piece) {
            if theirs.write_all(chunk).is_err() {
                return;
            }
        }
    });
    let bounds = Bounds {
        request: std::time::Duration::from_secs(5),
        line_max: 4096,
    };
    let taken = Client::from_stream(ours, bounds).map(|mut c| {
        while let Ok(reply) = c.read_reply() {
            let _ = crate::client::event_of(&reply.value);
        }
    });
    let _ = writer.join();
    taken.is_ok()
}
