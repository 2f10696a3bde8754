//! The page writer: guest pages onto the stream for whichever policy decides
//! which pages to send and when to stop (the pre-copy passes of `sender.rs`
//! today; a throttled pre-copy or post-copy could drive it the same way).
//!
//! It owns the stream [`Writer`], batches pages into RAM sections of about
//! [`SECTION_TARGET`] bytes as runs ([`PageRun`]), sends pages that read as
//! zero (and ranges the host never backed) as zero runs, counts what it sends
//! ([`Counts`], QEMU's `normal` and `duplicate`) and paces sections to the
//! bandwidth limit with a token bucket, a tenth of a second of the rate at
//! a time ([`piece_for`]). Between sections it asks its
//! [`Control`] whether to stop and what the limit is, and tells it what went
//! out; it knows nothing of passes, dirty logs or the guest's run state.
//! The stream format is `format.rs`'s.

use std::io::Write;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use zerocopy::IntoBytes;

use super::format::{self, Kind, PageRun, RunKind, Writer};
use crate::backing::{self as pages, Backing};
use crate::memory::GuestMemory;

/// A RAM section is sent once its payload reaches this size.
pub(crate) const SECTION_TARGET: usize = 4 << 20;
/// The longest single sleep while pacing, so that a cancel is seen soon.
const MAX_PACE_SLEEP: f64 = 0.05;

/// Why pages could not be sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Writing to the stream failed.
    #[error("sending the stream")]
    Stream(#[from] format::Error),
    /// Reading a guest page failed (page number given).
    #[error("reading guest RAM at page {0}")]
    Read(u64, #[source] vm_memory::GuestMemoryError),
    /// The [`Control`] said to stop.
    #[error("cancelled")]
    Cancelled,
}

/// What drives the writer, asked between sections.
pub(crate) trait Control {
    /// Whether to stop: checked before each section and while pacing.
    fn cancelled(&self) -> bool;
    /// Bytes per second allowed now (0: no limit); read at each section.
    fn max_bandwidth(&self) -> u64;
    /// A RAM section, or a piece of one, went out (after its pacing); the
    /// counts since the start. Within a section its pages are counted in
    /// proportion to its bytes sent, so that a slow link's counts move
    /// every piece rather than every 4 MiB (at 200 KB/s, 20 s); at its end
    /// they are exact.
    fn section_sent(&mut self, counts: &Counts);
}

/// What the writer has sent since the stream began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Pages sent in full (QEMU's `normal`).
    pub(crate) normal: u64,
    /// Pages sent as zero runs, a header only (QEMU's `duplicate`).
    pub(crate) duplicate: u64,
    /// Bytes of the pages sent in full.
    pub(crate) normal_bytes: u64,
    /// Bytes on the wire, every section and header included.
    pub(crate) bytes: u64,
}

impl Counts {
    /// Pages sent, zero and normal together.
    pub(crate) fn pages(&self) -> u64 {
        self.normal + self.duplicate
    }
}

/// The run being built in a RAM section's payload: its header's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenRun {
    at: usize,
    first: u64,
    count: u32,
    kind: RunKind,
}

/// Writes guest pages, batched, zero-detected, counted and paced, and any
/// other section the policy hands it.
///
/// Outside [`send_runs`](PageWriter::send_runs) no RAM is pending, so
/// [`section`](PageWriter::section) and [`finish`](PageWriter::finish) go
/// straight to the stream.
pub(crate) struct PageWriter<'m, W: Write> {
    out: Writer<W>,
    mem: &'m GuestMemory,
    counts: Counts,
    /// The counts as of the last RAM section sent in full.
    sent: Counts,
    /// The RAM section being built: `buf[..len]` (allocated and zeroed once,
    /// so a page is read into it without zero-filling it first).
    buf: Vec<u8>,
    len: usize,
    open: Option<OpenRun>,
    bucket: TokenBucket,
}

impl<'m, W: Write> PageWriter<'m, W> {
    /// A page writer on a started stream, reading pages from `mem`.
    pub(crate) fn new(out: Writer<W>, mem: &'m GuestMemory) -> Self {
        PageWriter {
            out,
            mem,
            counts: Counts::default(),
            sent: Counts::default(),
            buf: vec![0; SECTION_TARGET + (1 << 20)],
            len: 0,
            open: None,
            bucket: TokenBucket::new(Instant::now()),
        }
    }

    /// What was sent so far.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            bytes: self.out.bytes,
            ..self.counts
        }
    }

    /// Bytes on the wire so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.out.bytes
    }

    /// Writes one section other than RAM, paced like RAM sections (a vCPU
    /// section carries its queue: a link would take its time on it too).
    ///
    /// # Errors
    /// The write failed, or `ctl` said to stop while it was paced.
    pub(crate) fn section(
        &mut self,
        kind: Kind,
        parts: &[&[u8]],
        ctl: &mut impl Control,
    ) -> Result<(), Error> {
        paced(&mut self.out, &mut self.bucket, kind, parts, ctl, |_, _| {})
    }

    /// Writes the trailer and flushes.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn finish(&mut self) -> Result<(), format::Error> {
        self.out.finish()
    }

    /// The connection, to read the destination's replies.
    pub(crate) fn inner(&mut self) -> &mut W {
        self.out.inner()
    }

    /// The connection, shared.
    pub(crate) fn get_ref(&self) -> &W {
        self.out.get_ref()
    }

    /// Sends runs of pages: never-backed and zero-page runs as zero runs,
    /// data runs read page by page and sent as zero or normal; the last
    /// section goes out before it returns.
    ///
    /// # Errors
    /// A write or a read failed, or `ctl` said to stop.
    pub(crate) fn send_runs(
        &mut self,
        runs: &[(u64, u64, Backing)],
        ctl: &mut impl Control,
    ) -> Result<(), Error> {
        for &(first, count, backing) in runs {
            match backing {
                Backing::None | Backing::ZeroPage => self.add_zero(first, count),
                Backing::Data => {
                    for page in first..first + count {
                        self.add_page(page)?;
                        if self.len >= SECTION_TARGET {
                            self.flush(ctl)?;
                        }
                    }
                }
            }
            if self.len >= SECTION_TARGET {
                self.flush(ctl)?;
            }
        }
        self.flush(ctl)
    }

    fn add_zero(&mut self, first: u64, count: u64) {
        self.counts.duplicate += count;
        let (mut first, mut left) = (first, count);
        while left > 0 {
            let n = left.min(u64::from(u32::MAX));
            match self.open {
                Some(o) if o.kind == RunKind::Zero && o.first + u64::from(o.count) == first => {
                    let more = n.min(u64::from(u32::MAX - o.count));
                    if more == 0 {
                        self.open_run(first, RunKind::Zero);
                        continue;
                    }
                    // At most u32::MAX - o.count, so it fits.
                    self.grow(u32::try_from(more).unwrap_or(u32::MAX));
                    first += more;
                    left -= more;
                    continue;
                }
                _ => self.open_run(first, RunKind::Zero),
            }
            self.grow(u32::try_from(n).unwrap_or(u32::MAX));
            first += n;
            left -= n;
        }
    }

    /// Appends one page: its bytes after a normal run's header, or, when it
    /// reads as zero, a zero run.
    fn add_page(&mut self, page: u64) -> Result<(), Error> {
        let before = (self.len, self.open);
        let continues = matches!(self.open, Some(o) if o.kind == RunKind::Normal
            && o.first + u64::from(o.count) == page && o.count < u32::MAX);
        if !continues {
            self.open_run(page, RunKind::Normal);
        }
        let at = self.len;
        let end = at + format::PAGE_BYTES;
        self.reserve(end);
        self.len = end;
        self.mem
            .read_slice(
                &mut self.buf[at..end],
                GuestAddress(page * format::PAGE_SIZE),
            )
            .map_err(|e| Error::Read(page, e))?;
        if pages::is_zero(&self.buf[at..end]) {
            self.len = before.0;
            self.open = before.1;
            self.add_zero(page, 1);
            return Ok(());
        }
        self.grow(1);
        self.counts.normal += 1;
        self.counts.normal_bytes += format::PAGE_SIZE;
        Ok(())
    }

    fn open_run(&mut self, first: u64, kind: RunKind) {
        let at = self.len;
        let run = PageRun {
            first,
            count: 0,
            kind,
        };
        let end = at + size_of::<PageRun>();
        self.reserve(end);
        self.buf[at..end].copy_from_slice(run.as_bytes());
        self.len = end;
        self.open = Some(OpenRun {
            at,
            first,
            count: 0,
            kind,
        });
    }

    /// Makes the batch buffer at least `end` bytes long.
    fn reserve(&mut self, end: usize) {
        if self.buf.len() < end {
            self.buf.resize(end.max(self.buf.len() * 2), 0);
        }
    }

    /// Adds `n` pages to the open run, rewriting its header.
    fn grow(&mut self, n: u32) {
        if let Some(o) = &mut self.open {
            o.count += n;
            let run = PageRun {
                first: o.first,
                count: o.count,
                kind: o.kind,
            };
            self.buf[o.at..o.at + size_of::<PageRun>()].copy_from_slice(run.as_bytes());
        }
    }

    /// Sends the RAM section built so far, paced by the bandwidth limit.
    fn flush(&mut self, ctl: &mut impl Control) -> Result<(), Error> {
        self.open = None;
        if self.len == 0 {
            return Ok(());
        }
        if ctl.cancelled() {
            return Err(Error::Cancelled);
        }
        let payload = &self.buf[..self.len];
        let (from, to, bytes) = (self.sent, self.counts, self.out.bytes);
        let whole = crate::wire::SECTION_HEADER + payload.len() as u64;
        let mut out = 0;
        paced(
            &mut self.out,
            &mut self.bucket,
            Kind::Ram,
            &[payload],
            ctl,
            |ctl, n| {
                out += n;
                if out < whole {
                    ctl.section_sent(&partway(from, to, out, whole, bytes + out));
                }
            },
        )?;
        self.len = 0;
        self.sent = self.counts;
        ctl.section_sent(&self.counts());
        Ok(())
    }
}

/// Writes a section to `out` in pieces ([`piece_for`]), each followed by
/// its wait for the bandwidth limit (`bucket`) and then `told` (the
/// control and the piece's bytes).
fn paced<W: Write, C: Control>(
    out: &mut Writer<W>,
    bucket: &mut TokenBucket,
    kind: Kind,
    parts: &[&[u8]],
    ctl: &mut C,
    mut told: impl FnMut(&mut C, u64),
) -> Result<(), Error> {
    let piece = piece_for(ctl.max_bandwidth());
    out.section_in_pieces(kind, parts, piece, |n| {
        pace(bucket, n, &*ctl)?;
        told(ctl, n);
        Ok(())
    })
}

/// The counts `out` bytes into a RAM section of `whole` bytes that takes
/// them `from` one value `to` another: its pages in proportion to its bytes
/// sent, `bytes` on the wire.
fn partway(from: Counts, to: Counts, out: u64, whole: u64, bytes: u64) -> Counts {
    let share = |a: u64, b: u64| {
        let f = out.min(whole) as f64 / whole.max(1) as f64;
        a + crate::units::saturating_u64(b.saturating_sub(a) as f64 * f)
    };
    Counts {
        normal: share(from.normal, to.normal),
        duplicate: share(from.duplicate, to.duplicate),
        normal_bytes: share(from.normal_bytes, to.normal_bytes),
        bytes,
    }
}

/// How much of a section goes out between two waits for the bandwidth
/// limit: a tenth of a second of it, at least a byte and at most 1 MiB (no
/// limit: the whole section). A section paced whole, 4 MiB and then a
/// sleep, left a link of 100 KB/s silent for 40 s, past the destination's
/// idle deadline (30 s by default).
fn piece_for(rate: u64) -> usize {
    match rate {
        0 => usize::MAX,
        r => usize::try_from(r / 10)
            .unwrap_or(usize::MAX)
            .clamp(1, 1 << 20),
    }
}

/// Waits until `n` more bytes fit the bandwidth limit (`bucket`).
fn pace(bucket: &mut TokenBucket, n: u64, ctl: &impl Control) -> Result<(), Error> {
    let rate = ctl.max_bandwidth() as f64;
    let mut wait = bucket.charge(n, rate, Instant::now());
    while let Some(d) = wait {
        if ctl.cancelled() {
            return Err(Error::Cancelled);
        }
        std::thread::sleep(d);
        wait = bucket.refill(rate, Instant::now());
    }
    Ok(())
}

/// Token bucket behind every section's pieces: bytes that may go now, and
/// when it was last filled. Its burst is 20 ms of the rate or one section.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    tokens: f64,
    filled: Instant,
}

impl TokenBucket {
    fn new(now: Instant) -> Self {
        TokenBucket {
            tokens: 0.0,
            filled: now,
        }
    }

    /// Charges `n` bytes at `rate` bytes/s (0 or less: no limit): how long
    /// to sleep before they may go, or `None` when they may go now.
    fn charge(&mut self, n: u64, rate: f64, now: Instant) -> Option<Duration> {
        if rate <= 0.0 {
            self.tokens = 0.0;
            self.filled = now;
            return None;
        }
        let burst = (rate * 0.02).max(SECTION_TARGET as f64);
        let since = now.saturating_duration_since(self.filled).as_secs_f64();
        self.tokens = (self.tokens + since * rate).min(burst);
        self.filled = now;
        self.tokens -= n as f64;
        self.wait(rate)
    }

    /// After a sleep: credits the time since the last fill; the next sleep,
    /// or `None` once the debt is paid.
    fn refill(&mut self, rate: f64, now: Instant) -> Option<Duration> {
        self.tokens += now.saturating_duration_since(self.filled).as_secs_f64() * rate;
        self.filled = now;
        self.wait(rate)
    }

    fn wait(&self, rate: f64) -> Option<Duration> {
        (self.tokens < 0.0)
            .then(|| Duration::from_secs_f64((-self.tokens / rate).min(MAX_PACE_SLEEP)))
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
