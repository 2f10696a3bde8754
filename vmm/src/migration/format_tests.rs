//! Unit tests of `format.rs`.

use super::*;

fn stream(sections: &[(Kind, Vec<u8>)]) -> Vec<u8> {
    stream_in_pieces(sections, usize::MAX, &mut Vec::new())
}

/// The stream, each section written `piece` bytes at a time; the pieces'
/// sizes go into `pieces`.
fn stream_in_pieces(sections: &[(Kind, Vec<u8>)], piece: usize, pieces: &mut Vec<u64>) -> Vec<u8> {
    let mut w = Writer::start(Vec::new()).unwrap();
    for (k, p) in sections {
        w.section_in_pieces(*k, &[p], piece, |n| {
            pieces.push(n);
            Ok::<(), Error>(())
        })
        .unwrap();
    }
    w.finish().unwrap();
    std::mem::take(w.inner())
}

fn read_all(bytes: &[u8]) -> Result<u64, Error> {
    let mut r = Reader::start(bytes)?;
    loop {
        let (kind, len) = r.section()?;
        if kind == Kind::End {
            r.finish(len)?;
            return Ok(r.sections);
        }
        let mut buf = vec![0; usize::try_from(len).unwrap()];
        r.read_exact(&mut buf, kind.name())?;
    }
}

#[test]
fn a_written_stream_reads_back_with_its_checksum() {
    let s = stream(&[(
        Kind::Pass,
        PassRecord { pass: 1, pages: 2 }.as_bytes().to_vec(),
    )]);
    assert_eq!(read_all(&s).unwrap(), 1);
}

#[test]
fn a_flipped_byte_is_a_checksum_error() {
    let mut s = stream(&[(Kind::Pass, vec![0; 16])]);
    s[40] ^= 1;
    assert!(matches!(read_all(&s), Err(Error::Checksum { .. })));
}

#[test]
fn a_truncated_stream_says_so() {
    let s = stream(&[(Kind::Pass, vec![0; 16])]);
    for cut in [4, 20, 40, s.len() - 3] {
        assert!(
            matches!(read_all(&s[..cut]), Err(Error::Truncated(_))),
            "cut at {cut}"
        );
    }
}

#[test]
fn another_version_is_refused_naming_both() {
    let mut s = stream(&[]);
    s[8] = 9;
    let e = read_all(&s).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream version 9 is not supported: this kvmscope reads version 1"
    );
}

#[test]
fn an_oversized_section_is_refused_before_allocating() {
    let mut w = Writer::start(Vec::new()).unwrap();
    let h = SectionHeader {
        kind: Kind::Ram,
        reserved: 0,
        len: u64::MAX,
    };
    w.inner().extend_from_slice(h.as_bytes());
    let e = read_all(w.inner()).unwrap_err();
    assert!(matches!(e, Error::TooLong { what: "RAM", .. }), "{e}");
}

#[test]
fn replies_round_trip() {
    let mut buf = Vec::new();
    write_reply(&mut buf, REPLY_REFUSED, "memory differs").unwrap();
    assert_eq!(
        read_reply(&mut &buf[..]).unwrap(),
        (REPLY_REFUSED, "memory differs".to_string())
    );
}

#[test]
fn a_malformed_reply_says_what_is_wrong_and_a_message_stays_on_one_line() {
    let mut buf = Vec::new();
    write_reply(&mut buf, REPLY_REFUSED, "no\r\n\x1b[2Jroom").unwrap();
    let (_, msg) = read_reply(&mut &buf[..]).unwrap();
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    // Its magic (the header's first 4 bytes) wrong: not "truncated".
    let mut bad = buf.clone();
    bad[..4].copy_from_slice(b"JUNK");
    let e = read_reply(&mut &bad[..]).unwrap_err();
    assert!(matches!(e, Error::BadReply(_)), "{e}");
    // On one line, its bytes in hex (an HTTP answer read as a
    // destination's reply spread them over ten lines of error-desc).
    assert_eq!(
        e.to_string(),
        "the destination's reply is malformed: its magic is [4a, 55, 4e, 4b] (\"JUNK\"), not [4b, 53, 4d, 52]: not a kvmscope destination"
    );
    // A length over the limit, before anything is allocated.
    let mut long = Vec::new();
    write_reply(&mut long, REPLY_REFUSED, "").unwrap();
    // The header's `len`, after its magic and code.
    long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = read_reply(&mut &long[..]).unwrap_err();
    assert!(e.to_string().contains("over the 4096-byte limit"), "{e}");
}

#[test]
fn a_section_of_an_unknown_kind_is_refused_by_its_value() {
    let mut w = Writer::start(Vec::new()).unwrap();
    let mut raw = 9u32.to_ne_bytes().to_vec();
    raw.extend_from_slice(&[0; 12]);
    w.inner().extend_from_slice(&raw);
    let e = read_all(w.inner()).unwrap_err();
    assert!(matches!(e, Error::Kind(9)), "{e}");
}

#[test]
fn the_sizes_the_stop_test_counts_are_the_streams() {
    use crate::wire;
    let size = |n: usize| n as u64;
    assert_eq!(wire::PAGE, PAGE_SIZE);
    assert_eq!(wire::SECTION_HEADER, size(size_of::<SectionHeader>()));
    assert_eq!(wire::RUN_HEADER, size(size_of::<PageRun>()));
    assert_eq!(
        wire::PASS_BYTES,
        wire::SECTION_HEADER + size(size_of::<PassRecord>())
    );
    assert_eq!(
        wire::END_BYTES,
        wire::SECTION_HEADER + size(size_of::<Trailer>())
    );
    assert_eq!(
        wire::SETUP_BYTES,
        size(size_of::<StreamHeader>())
            + wire::SECTION_HEADER
            + size(size_of::<ConfigRecord>())
            + wire::SECTION_HEADER
            + size(size_of::<PlanRange>())
    );
    assert_eq!(
        wire::SECTION_TARGET,
        size(crate::migration::writer::SECTION_TARGET)
    );
    // An idle vCPU's section: the header and KVM's state in this build, the
    // MSRs and the VMM's JSON as measured (`wire::VCPU_BYTES`) cover them.
    assert!(
        wire::VCPU_BYTES
            > size(size_of::<VcpuHeader>()) + size(size_of::<kvm_bindings::kvm_xsave>())
    );
}

#[test]
fn a_section_written_in_pieces_is_the_same_bytes_and_each_piece_is_told() {
    let sections = vec![(Kind::Ram, vec![7u8; 10_000]), (Kind::Pass, vec![1u8; 16])];
    let whole = stream(&sections);
    let mut pieces = Vec::new();
    let split = stream_in_pieces(&sections, 4096, &mut pieces);
    assert_eq!(whole, split);
    // The RAM section's 16-byte header and 10,000 bytes: 4096, 4096 and
    // 1,824; the pass section whole (32 bytes).
    assert_eq!(pieces, [4096, 4096, 1824, 32]);
    assert_eq!(read_all(&split).unwrap(), 2);
}
