//! Unit tests of `writer.rs`: the page writer on an in-memory sink, its
//! bytes read back with the stream reader and the receiver's run parser.

use super::super::format::Reader;
use super::super::receiver;
use super::*;

const PAGE: u64 = format::PAGE_SIZE;

/// A control that records what it hears.
#[derive(Default)]
struct Recorder {
    cancel: bool,
    rate: u64,
    sent: Vec<Counts>,
}

impl Control for Recorder {
    fn cancelled(&self) -> bool {
        self.cancel
    }
    fn max_bandwidth(&self) -> u64 {
        self.rate
    }
    fn section_sent(&mut self, counts: &Counts) {
        self.sent.push(*counts);
    }
}

fn memory(pages: u64) -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), usize::try_from(pages * PAGE).unwrap())]).unwrap()
}

/// Fills page `p` with a pattern that names it (never all zero).
fn fill(mem: &GuestMemory, p: u64) {
    let bytes: Vec<u8> = (0..PAGE)
        .map(|i| u8::try_from((p + i) % 251).unwrap() | 1)
        .collect();
    mem.write_slice(&bytes, GuestAddress(p * PAGE)).unwrap();
}

/// A run as (first, count, kind), its pages' bytes.
type Run = ((u64, u32, format::RunKind), Vec<u8>);

/// Each RAM section's runs, read back from a whole stream.
fn ram_sections(stream: &[u8], pages: u64) -> Vec<Vec<Run>> {
    let mut r = Reader::start(stream).unwrap();
    let mut out = Vec::new();
    loop {
        let (kind, len) = r.section().unwrap();
        if kind == Kind::End {
            r.finish(len).unwrap();
            return out;
        }
        let mut buf = vec![0; usize::try_from(len).unwrap()];
        r.read_exact(&mut buf, kind.name()).unwrap();
        if kind == Kind::Ram {
            let runs = receiver::runs(&buf, pages).unwrap();
            out.push(
                runs.into_iter()
                    .map(|(run, data)| ((run.first, run.count, run.kind), data.to_vec()))
                    .collect(),
            );
        }
    }
}

/// Sends `runs` of `mem` on a fresh stream: the stream and what the control heard.
fn send(mem: &GuestMemory, runs: &[(u64, u64, Backing)], ctl: &mut Recorder) -> (Vec<u8>, Counts) {
    let mut w = PageWriter::new(Writer::start(Vec::new()).unwrap(), mem);
    w.send_runs(runs, ctl).unwrap();
    let counts = w.counts();
    assert_eq!(
        counts.bytes,
        w.get_ref().len() as u64,
        "bytes counts the wire"
    );
    w.finish().unwrap();
    (std::mem::take(w.inner()), counts)
}

#[test]
fn zero_pages_become_zero_runs_merged_with_neighbours() {
    let mem = memory(32);
    for p in [0, 3, 20] {
        fill(&mem, p);
    }
    // Pages 0..5 read (1, 2 and 4 read as zero), 5..15 never backed, 15..21 read.
    let runs = [
        (0, 5, Backing::Data),
        (5, 10, Backing::None),
        (15, 6, Backing::Data),
    ];
    let (stream, counts) = send(&mem, &runs, &mut Recorder::default());
    let sections = ram_sections(&stream, 32);
    assert_eq!(sections.len(), 1, "all of it fits one section");
    let shape: Vec<_> = sections[0].iter().map(|r| r.0).collect();
    let (n, z) = (format::RunKind::Normal, format::RunKind::Zero);
    assert_eq!(
        shape,
        vec![(0, 1, n), (1, 2, z), (3, 1, n), (4, 16, z), (20, 1, n)],
        "a zero page read next to never-backed pages joins their run"
    );
    assert_eq!(counts.normal, 3);
    assert_eq!(counts.duplicate, 18);
    assert_eq!(counts.normal_bytes, 3 * PAGE);
    assert_eq!(counts.pages(), 21);
}

#[test]
fn the_stream_decodes_to_the_same_pages() {
    let pages = 2048;
    let mem = memory(pages);
    for p in (0..pages).filter(|p| p % 3 != 0) {
        fill(&mem, p);
    }
    let (stream, _) = send(&mem, &[(0, pages, Backing::Data)], &mut Recorder::default());
    let mut image = vec![0u8; usize::try_from(pages * PAGE).unwrap()];
    let mut seen = vec![false; usize::try_from(pages).unwrap()];
    for ((first, count, kind), data) in ram_sections(&stream, pages).into_iter().flatten() {
        for i in 0..u64::from(count) {
            let p = usize::try_from(first + i).unwrap();
            assert!(!seen[p], "page {p} sent twice");
            seen[p] = true;
            if kind == format::RunKind::Normal {
                let at = usize::try_from(i * PAGE).unwrap();
                image[p * 4096..(p + 1) * 4096].copy_from_slice(&data[at..at + 4096]);
            }
        }
    }
    assert!(seen.iter().all(|&s| s), "every page sent");
    let mut source = vec![0u8; image.len()];
    mem.read_slice(&mut source, GuestAddress(0)).unwrap();
    assert!(source == image, "the destination's image equals guest RAM");
}

#[test]
fn sections_close_near_the_target_and_report_each() {
    // 2.5 sections' worth of normal pages.
    let pages = 2560;
    let mem = memory(pages);
    (0..pages).for_each(|p| fill(&mem, p));
    let mut ctl = Recorder::default();
    let (stream, counts) = send(&mem, &[(0, pages, Backing::Data)], &mut ctl);
    let sections = ram_sections(&stream, pages);
    assert_eq!(sections.len(), 3);
    for s in &sections[..2] {
        let len: usize = s.iter().map(|r| 16 + r.1.len()).sum();
        assert!(
            (SECTION_TARGET..SECTION_TARGET + 4096 + 16).contains(&len),
            "a full section closes at the first page past the target ({len} bytes)"
        );
        assert_eq!(s.len(), 1, "contiguous pages make one run per section");
    }
    assert_eq!(ctl.sent.len(), 3, "the control hears of every section");
    assert_eq!(ctl.sent.last(), Some(&counts));
    assert!(ctl.sent.windows(2).all(|w| w[0].normal < w[1].normal));
}

#[test]
fn on_a_slow_link_the_counts_move_every_piece_and_are_exact_at_each_sections_end() {
    // Two and a half sections (10 MB) at 100 MB/s: pieces of 1 MiB.
    let pages = 2560;
    let mem = memory(pages);
    (0..pages).for_each(|p| fill(&mem, p));
    let mut ctl = Recorder {
        rate: 100_000_000,
        ..Recorder::default()
    };
    let (_, counts) = send(&mem, &[(0, pages, Backing::Data)], &mut ctl);
    let heard = &ctl.sent;
    assert!(
        heard.len() >= 10,
        "told {} times for 3 sections",
        heard.len()
    );
    assert_eq!(heard.last(), Some(&counts));
    assert!(
        heard.windows(2).all(|w| w[0].bytes < w[1].bytes
            && w[0].normal <= w[1].normal
            && w[0].normal_bytes <= w[1].normal_bytes),
        "the counts only grow: {heard:?}"
    );
    // The first piece: 1 MiB of a section of 1,024 pages (4 MiB, its run
    // header and its section header).
    let first = heard[0];
    assert_eq!(first.bytes, 16 + (1 << 20), "the stream header and a piece");
    assert!(
        (250..=260).contains(&first.normal),
        "a quarter of the section's pages: {first:?}"
    );
    // Where a section ends, its pages are all counted, in whole.
    assert!(
        heard
            .iter()
            .any(|c| c.normal == 1024 && c.normal_bytes == 1024 * PAGE),
        "the first section's end: {heard:?}"
    );
}

#[test]
fn a_zero_run_longer_than_a_header_holds_is_split() {
    let mem = memory(1);
    let mut w = PageWriter::new(Writer::start(Vec::new()).unwrap(), &mem);
    let many = u64::from(u32::MAX) + 5;
    w.add_zero(0, many);
    let runs = receiver::runs(&w.buf[..w.len], u64::MAX).unwrap();
    let shape: Vec<_> = runs.iter().map(|(r, _)| (r.first, r.count)).collect();
    assert_eq!(shape, vec![(0, u32::MAX), (u64::from(u32::MAX), 5)]);
    assert_eq!(w.counts().duplicate, many);
}

#[test]
fn a_cancel_stops_before_the_section_goes_out() {
    let mem = memory(4);
    fill(&mem, 1);
    let mut ctl = Recorder {
        cancel: true,
        ..Recorder::default()
    };
    let mut w = PageWriter::new(Writer::start(Vec::new()).unwrap(), &mem);
    let header = w.bytes();
    assert!(matches!(
        w.send_runs(&[(0, 4, Backing::Data)], &mut ctl),
        Err(Error::Cancelled)
    ));
    assert_eq!(w.bytes(), header, "nothing written");
    assert!(ctl.sent.is_empty());
}

#[test]
fn a_page_outside_guest_ram_is_a_read_error_naming_it() {
    let mem = memory(4);
    let mut w = PageWriter::new(Writer::start(Vec::new()).unwrap(), &mem);
    let err = w
        .send_runs(&[(2, 4, Backing::Data)], &mut Recorder::default())
        .unwrap_err();
    assert!(matches!(err, Error::Read(4, _)), "{err:?}");
}

#[test]
fn no_limit_never_waits() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(t0);
    assert_eq!(b.charge(1 << 30, 0.0, t0), None);
    assert_eq!(b.charge(1 << 30, 0.0, t0), None);
}

#[test]
fn a_section_over_the_tokens_waits_its_size_over_the_rate() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut b = TokenBucket::new(t0);
    let rate = 100e6;
    // 4 MB from an empty bucket at 100 MB/s: 40 ms.
    let wait = b.charge(4_000_000, rate, t0).unwrap();
    assert!((wait.as_secs_f64() - 0.04).abs() < 1e-9, "{wait:?}");
    // 30 ms later, 10 ms of debt are left; 40 ms later it is paid.
    let left = b.refill(rate, t0 + ms(30)).unwrap();
    assert!((left.as_secs_f64() - 0.01).abs() < 1e-9, "{left:?}");
    assert_eq!(b.refill(rate, t0 + ms(40)), None);
}

#[test]
fn one_sleep_is_at_most_50_ms_so_a_cancel_is_seen() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(t0);
    // 4 MiB at 1 MB/s is 4 s of debt, slept in 50 ms steps.
    assert_eq!(
        b.charge(4 << 20, 1e6, t0),
        Some(Duration::from_secs_f64(MAX_PACE_SLEEP))
    );
}

#[test]
fn an_idle_link_banks_one_burst_only() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(t0);
    let rate = 10e6;
    // The burst is max(20 ms of the rate, one section) = one section here.
    assert_eq!(b.charge(0, rate, t0), None);
    let later = t0 + Duration::from_secs(60);
    assert_eq!(
        b.charge(SECTION_TARGET as u64, rate, later),
        None,
        "one section fits"
    );
    let wait = b.charge(1_000_000, rate, later).unwrap();
    assert!(
        (wait.as_secs_f64() - 0.05).abs() < 1e-9,
        "the next waits: {wait:?}"
    );
    // At 1 GB/s 20 ms of the rate, 20 MB, is over a section.
    let mut fast = TokenBucket::new(t0);
    fast.charge(0, 1e9, t0);
    assert_eq!(fast.charge(20_000_000, 1e9, later), None);
    assert!(fast.charge(1_000_000, 1e9, later).is_some());
}
