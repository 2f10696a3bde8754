//! Unit tests of `format.rs`.

use super::*;

fn stream(sections: &[(Kind, Vec<u8>)]) -> Vec<u8> {
    let mut w = Writer::start(Vec::new()).unwrap();
    for (k, p) in sections {
        w.section(*k, &[p]).unwrap();
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
fn a_section_of_an_unknown_kind_is_refused_by_its_value() {
    let mut w = Writer::start(Vec::new()).unwrap();
    let mut raw = 9u32.to_ne_bytes().to_vec();
    raw.extend_from_slice(&[0; 12]);
    w.inner().extend_from_slice(&raw);
    let e = read_all(w.inner()).unwrap_err();
    assert!(matches!(e, Error::Kind(9)), "{e}");
}
