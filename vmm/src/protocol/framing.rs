//! Splitting a byte stream into JSON values, as QEMU's QMP server does: values
//! may be separated by anything or nothing (`{..}{..}`, one per line, or one
//! spread over many lines), so a client that sends compact JSON without a
//! trailing newline (QEMU's own `qemu.qmp` library) is served as soon as its
//! value is complete.
//!
//! The framer only finds where each top-level value ends: it tracks nesting of
//! `{}`/`[]` outside strings, with string escapes. Whether the bytes are valid
//! JSON is for the parser (`serde_json`) to say, except for bytes that can
//! never appear outside a JSON string (control bytes, most letters): on one,
//! the value so far and the rest of that line are dropped with an error, so
//! a client that sent garbage is back in step at its next line, as with
//! QEMU's lexer recovery. Pure code, no I/O, bounded:
//! one value may be at most [`MAX_VALUE`] bytes (past that the connection
//! cannot resynchronise and is closed) and nest at most [`MAX_DEPTH`] deep
//! (such a value is skipped with an error, and the stream goes on).

/// Largest value a client may send, in bytes.
pub const MAX_VALUE: usize = 64 << 10;
/// Deepest nesting of objects and arrays in one value.
pub(crate) const MAX_DEPTH: u32 = 32;

/// What the framer found next in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A complete top-level value (or scalar token), for the parser.
    Value(Vec<u8>),
    /// Bytes that cannot start or be a value, skipped; the reason says why.
    Invalid(String),
    /// A value longer than [`MAX_VALUE`]: the stream cannot go on.
    TooLarge,
}

/// What scanning on from the last position found.
enum Scanned {
    /// The value ends just before this index.
    Complete(usize),
    /// More input is needed.
    Incomplete,
    /// This byte cannot be part of JSON outside a string.
    Invalid(u8),
}

/// True for bytes that may appear in JSON outside strings: whitespace,
/// punctuation, number characters and the letters of `true`, `false`, `null`.
fn lexical(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | b'\r' | b'{' | b'}' | b'[' | b']' | b':' | b',' | b'"'
    ) || matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
        || b"truefalsn".contains(&b)
}

/// Where the scanner is inside the current value.
#[derive(Debug, Default, Clone, Copy)]
struct Scan {
    depth: u32,
    deepest: u32,
    in_string: bool,
    escape: bool,
}

/// A client's input, split into values as they complete.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    buf: Vec<u8>,
    /// Start of the value being scanned (bytes before it are consumed).
    start: usize,
    /// How far into `buf` the scanner got.
    pos: usize,
    scan: Scan,
    /// A value has started (its first byte is at `start`).
    open: bool,
}

impl Framer {
    /// An empty framer.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends what the client sent.
    pub(crate) fn extend(&mut self, data: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.pos -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// True when bytes of an unfinished value are waiting (the client is
    /// mid-request).
    pub(crate) fn partial(&self) -> bool {
        self.buf[self.start..]
            .iter()
            .any(|b| !b.is_ascii_whitespace())
    }

    /// The next frame, if one is complete. `ended`: the client will send no
    /// more, so a scalar token that runs to the end of the input is complete
    /// (an unfinished object or array is then dropped without a frame).
    pub(crate) fn next_frame(&mut self, ended: bool) -> Option<Frame> {
        if !self.open {
            self.skip_whitespace();
            let &first = self.buf.get(self.start)?;
            match first {
                // A string is scanned as objects are, from where the last
                // read left off (it was rescanned whole after every read:
                // a 64 KiB one sent a byte at a time cost 2e9 steps).
                b'{' | b'[' | b'"' => {
                    self.open = true;
                    self.pos = self.start;
                    self.scan = Scan::default();
                }
                b'}' | b']' => {
                    self.start += 1;
                    self.pos = self.start;
                    return Some(Frame::Invalid(format!(
                        "'{}' closes nothing",
                        char::from(first)
                    )));
                }
                _ => return self.scalar(ended),
            }
        }
        match self.scan_value() {
            Scanned::Complete(end) => Some(self.take(end)),
            Scanned::Invalid(b) => Some(self.recover(b)),
            Scanned::Incomplete if self.pos - self.start > MAX_VALUE => {
                self.discard_rest();
                Some(Frame::TooLarge)
            }
            Scanned::Incomplete => {
                if ended {
                    // An unclosed string is handed on whole (the parser
                    // says why it is no request), an unfinished object or
                    // array dropped.
                    if self.buf[self.start] == b'"' {
                        let end = self.buf.len();
                        return Some(self.take(end));
                    }
                    self.discard_rest();
                }
                None
            }
        }
    }

    fn skip_whitespace(&mut self) {
        while self
            .buf
            .get(self.start)
            .is_some_and(u8::is_ascii_whitespace)
        {
            self.start += 1;
        }
        self.pos = self.pos.max(self.start);
    }

    /// Drops the value so far and the rest of its line, after an invalid byte.
    fn recover(&mut self, bad: u8) -> Frame {
        let rest = &self.buf[self.pos..];
        self.pos += rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        self.start = self.pos;
        self.open = false;
        Frame::Invalid(format!(
            "invalid character {:?}; skipped to the end of the line",
            char::from(bad)
        ))
    }

    /// Scans on from `pos` until the value closes, more input is needed, or
    /// a byte that cannot be JSON.
    fn scan_value(&mut self) -> Scanned {
        let s = &mut self.scan;
        while self.pos < self.buf.len() {
            let b = self.buf[self.pos];
            self.pos += 1;
            // Every byte counts, those inside a string too (a long string
            // closed within one read was let through whole).
            if self.pos - self.start > MAX_VALUE {
                return Scanned::Incomplete;
            }
            if s.in_string {
                match (s.escape, b) {
                    (true, _) => s.escape = false,
                    (false, b'\\') => s.escape = true,
                    (false, b'"') => {
                        s.in_string = false;
                        // A string at the top is a whole value.
                        if s.depth == 0 {
                            return Scanned::Complete(self.pos);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => s.in_string = true,
                b'{' | b'[' => {
                    s.depth += 1;
                    s.deepest = s.deepest.max(s.depth);
                }
                b'}' | b']' => {
                    s.depth -= 1;
                    if s.depth == 0 {
                        return Scanned::Complete(self.pos);
                    }
                }
                b if !lexical(b) => return Scanned::Invalid(b),
                _ => {}
            }
        }
        Scanned::Incomplete
    }

    /// Takes the value `start..end` out of the stream.
    fn take(&mut self, end: usize) -> Frame {
        let bytes = self.buf[self.start..end].to_vec();
        self.start = end;
        self.pos = end;
        self.open = false;
        if self.scan.deepest > MAX_DEPTH {
            return Frame::Invalid(format!(
                "the value nests {} levels deep; at most {MAX_DEPTH} are allowed",
                self.scan.deepest
            ));
        }
        Frame::Value(bytes)
    }

    /// A top-level token that is not an object, array or string (a number,
    /// `true`, or junk): it runs to the next whitespace, bracket or quote.
    /// It is handed to the parser, which says why it is not a request. Each
    /// byte is looked at once, however many reads it takes to arrive.
    fn scalar(&mut self, ended: bool) -> Option<Frame> {
        let rest = &self.buf[self.start..];
        let from = self.pos.saturating_sub(self.start).min(rest.len());
        let len = rest[from..]
            .iter()
            .position(|b| b.is_ascii_whitespace() || b"{}[]\"".contains(b))
            .map(|i| from + i);
        if len.is_none() {
            self.pos = self.buf.len();
        }
        let len = match len {
            Some(n) if n > MAX_VALUE => {
                self.discard_rest();
                return Some(Frame::TooLarge);
            }
            Some(n) => n,
            None if rest.len() > MAX_VALUE => {
                self.discard_rest();
                return Some(Frame::TooLarge);
            }
            None if ended => rest.len(),
            None => return None,
        };
        if let Some(&bad) = rest[..len].iter().find(|&&b| !lexical(b)) {
            self.pos = self.start;
            return Some(self.recover(bad));
        }
        let token = rest[..len].to_vec();
        self.start += len;
        self.pos = self.start;
        Some(Frame::Value(token))
    }

    fn discard_rest(&mut self) {
        self.start = self.buf.len();
        self.pos = self.start;
        self.open = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[&[u8]], ended: bool) -> Vec<Frame> {
        let mut f = Framer::new();
        let mut out = Vec::new();
        for chunk in input {
            f.extend(chunk);
            while let Some(frame) = f.next_frame(false) {
                out.push(frame);
            }
        }
        while let Some(frame) = f.next_frame(ended) {
            out.push(frame);
        }
        out
    }

    fn value(s: &str) -> Frame {
        Frame::Value(s.as_bytes().to_vec())
    }

    #[test]
    fn a_value_without_a_trailing_newline_is_complete_at_its_closing_brace() {
        assert_eq!(
            frames(&[br#"{"execute":"qmp_capabilities"}"#], false),
            [value(r#"{"execute":"qmp_capabilities"}"#)]
        );
    }

    #[test]
    fn back_to_back_values_split_without_separators() {
        assert_eq!(
            frames(&[br#"{"a":1}{"b":[2]}"#], false),
            [value(r#"{"a":1}"#), value(r#"{"b":[2]}"#)]
        );
    }

    #[test]
    fn a_value_spread_over_lines_and_reads_is_one_frame() {
        let got = frames(
            &[b"{\n  \"execute\":", b" \"query-status\"\n", b"}\n"],
            false,
        );
        assert_eq!(got, [value("{\n  \"execute\": \"query-status\"\n}")]);
    }

    #[test]
    fn braces_and_escaped_quotes_inside_strings_do_not_count() {
        let s = r#"{"a":"}\"{[","b":"\\"}"#;
        assert_eq!(frames(&[s.as_bytes()], false), [value(s)]);
    }

    #[test]
    fn a_stray_closing_brace_is_reported_and_skipped() {
        assert_eq!(
            frames(&[b"} {\"a\":1}"], false),
            [
                Frame::Invalid("'}' closes nothing".into()),
                value(r#"{"a":1}"#)
            ]
        );
    }

    #[test]
    fn a_scalar_token_waits_for_its_end_then_goes_to_the_parser() {
        assert_eq!(frames(&[b"12"], false), []);
        assert_eq!(frames(&[b"12", b"3\n"], false), [value("123")]);
        assert_eq!(frames(&[b"true"], true), [value("true")]);
        assert_eq!(
            frames(&[b"\"a b\" 5"], true),
            [value("\"a b\""), value("5")]
        );
    }

    #[test]
    fn garbage_drops_the_value_and_its_line_then_the_next_line_is_served() {
        let got = frames(
            &[b"{\"execute\": \n\x00 junk\n{\"a\":1}\nhello world\n[2]"],
            false,
        );
        assert!(matches!(&got[0], Frame::Invalid(why) if why.contains("invalid character")));
        assert_eq!(got[1], value(r#"{"a":1}"#));
        assert!(matches!(&got[2], Frame::Invalid(_)));
        assert_eq!(got[3], value("[2]"));
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn too_deep_values_are_skipped_and_the_stream_goes_on() {
        let deep = "[".repeat(MAX_DEPTH as usize + 1) + &"]".repeat(MAX_DEPTH as usize + 1);
        let input = format!("{deep}{{\"a\":1}}");
        let got = frames(&[input.as_bytes()], false);
        assert!(matches!(&got[0], Frame::Invalid(why) if why.contains("levels deep")));
        assert_eq!(got[1], value(r#"{"a":1}"#));
    }

    #[test]
    fn a_value_over_the_limit_is_too_large() {
        let mut big = b"{\"a\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_VALUE));
        assert_eq!(frames(&[&big], false), [Frame::TooLarge]);
    }

    #[test]
    fn a_value_over_the_limit_is_too_large_however_it_arrives() {
        // A long string closed within the same read as the rest of its
        // value, in one read or a few: every byte counts.
        let over = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_VALUE));
        assert_eq!(frames(&[over.as_bytes()], false), [Frame::TooLarge]);
        let (head, tail) = over.as_bytes().split_at(100);
        assert_eq!(frames(&[head, tail], false), [Frame::TooLarge]);
        // A top-level string too.
        let scalar = format!("\"{}\" ", "x".repeat(MAX_VALUE));
        assert_eq!(frames(&[scalar.as_bytes()], false), [Frame::TooLarge]);
        // At the limit, a value is whole.
        let fill = MAX_VALUE - r#"{"a":""}"#.len();
        let at = format!("{{\"a\":\"{}\"}}", "x".repeat(fill));
        assert_eq!(at.len(), MAX_VALUE);
        assert_eq!(frames(&[at.as_bytes()], false), [value(&at)]);
    }

    #[test]
    fn top_level_strings_and_tokens_come_whole_however_they_arrive() {
        let input = b"\"a {b} \\\" c\" 12345 {\"x\":1}";
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        let got = frames(&bytes, true);
        assert_eq!(
            got,
            [
                value(r#""a {b} \" c""#),
                value("12345"),
                value(r#"{"x":1}"#)
            ]
        );
        // An unclosed string at the end is handed on (the parser says why
        // it is no request); an unclosed object is not.
        assert_eq!(frames(&[b"\"abc"], true), [value("\"abc")]);
        assert_eq!(frames(&[b"\"abc"], false), []);
    }

    #[test]
    fn an_unfinished_value_at_end_of_stream_gives_no_frame() {
        assert_eq!(frames(&[b"{\"a\":"], true), []);
    }

    #[test]
    fn partial_is_true_only_inside_a_value() {
        let mut f = Framer::new();
        f.extend(b" \n");
        assert!(!f.partial());
        f.extend(b"{\"a\"");
        assert!(f.next_frame(false).is_none());
        assert!(f.partial());
        f.extend(b":1}");
        assert!(f.next_frame(false).is_some());
        assert!(!f.partial());
    }

    #[test]
    fn consumed_input_is_released() {
        let mut f = Framer::new();
        for _ in 0..10_000 {
            f.extend(b"{\"execute\":\"query-status\"}\n");
            assert!(f.next_frame(false).is_some());
        }
        assert!(f.buf.len() < 1024, "buffer grew to {}", f.buf.len());
    }
}
