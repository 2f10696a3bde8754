//! A small SVG writer: elements with escaped attributes and text, one per line,
//! closed in order, so the document is well-formed whatever the text holds.

use std::fmt::{Display, Write};

/// Fonts tried in order; DejaVu ships with most Linux systems.
const FONTS: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";

/// One element's tag and attributes, built up before it is written.
pub struct El {
    tag: &'static str,
    attrs: String,
}

impl El {
    pub fn new(tag: &'static str) -> Self {
        El {
            tag,
            attrs: String::new(),
        }
    }

    /// Adds an attribute; the value is escaped.
    pub fn attr(mut self, name: &str, value: impl Display) -> Self {
        let value = value.to_string();
        // Writing to a String cannot fail.
        let _ = write!(self.attrs, " {name}=\"{}\"", escape(&value));
        self
    }

    /// Adds a numeric attribute, rounded to a tenth of a pixel.
    pub fn num(self, name: &str, v: f64) -> Self {
        self.attr(name, num(v))
    }
}

/// An SVG document being written.
pub struct Svg {
    out: String,
    open: Vec<&'static str>,
}

impl Svg {
    /// Starts a `width` x `height` document with the chart's fonts.
    pub fn new(width: u32, height: u32) -> Self {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let root = El::new("svg")
            .attr("xmlns", "http://www.w3.org/2000/svg")
            .attr("width", width)
            .attr("height", height)
            .attr("viewBox", format!("0 0 {width} {height}"))
            .attr("font-family", FONTS)
            .attr("font-size", 12);
        let _ = writeln!(out, "<svg{}>", root.attrs);
        Svg {
            out,
            open: vec!["svg"],
        }
    }

    fn indent(&mut self) {
        for _ in 0..self.open.len() {
            self.out.push_str("  ");
        }
    }

    /// Writes an element with no content.
    pub fn leaf(&mut self, el: El) {
        self.indent();
        let _ = writeln!(self.out, "<{}{}/>", el.tag, el.attrs);
    }

    /// Opens an element; `close` ends it.
    pub fn open(&mut self, el: El) {
        self.indent();
        let _ = writeln!(self.out, "<{}{}>", el.tag, el.attrs);
        self.open.push(el.tag);
    }

    /// Closes the innermost open element (never the document itself).
    pub fn close(&mut self) {
        if self.open.len() > 1 {
            if let Some(tag) = self.open.pop() {
                self.indent();
                let _ = writeln!(self.out, "</{tag}>");
            }
        }
    }

    /// Writes an element whose content is `text`, escaped.
    pub fn text(&mut self, el: El, text: &str) {
        self.indent();
        let _ = writeln!(
            self.out,
            "<{}{}>{}</{}>",
            el.tag,
            el.attrs,
            escape(text),
            el.tag
        );
    }

    /// Closes whatever is still open and returns the document.
    pub fn finish(mut self) -> String {
        while let Some(tag) = self.open.pop() {
            self.indent();
            let _ = writeln!(self.out, "</{tag}>");
        }
        self.out
    }
}

/// A rectangle in chart pixels.
#[derive(Debug, Clone, Copy)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl Rect {
    pub fn right(self) -> f64 {
        self.x + self.w
    }

    pub fn bottom(self) -> f64 {
        self.y + self.h
    }
}

/// A `<rect>` covering `r` (negative sizes become 0).
pub fn rect(r: Rect) -> El {
    El::new("rect")
        .num("x", r.x)
        .num("y", r.y)
        .num("width", r.w.max(0.0))
        .num("height", r.h.max(0.0))
}

/// A `<line>` from (x1, y1) to (x2, y2).
pub fn line(x1: f64, y1: f64, x2: f64, y2: f64) -> El {
    El::new("line")
        .num("x1", x1)
        .num("y1", y1)
        .num("x2", x2)
        .num("y2", y2)
}

/// A small dot marking a lone sample.
pub fn circle(x: f64, y: f64) -> El {
    El::new("circle").num("cx", x).num("cy", y).num("r", 3.0)
}

/// `x,y x,y ...` for a polyline or polygon.
pub fn coords(points: impl Iterator<Item = (f64, f64)>) -> String {
    points
        .map(|(x, y)| format!("{},{}", num(x), num(y)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Escapes text for XML content and attribute values; characters XML 1.0
/// cannot hold (most control characters) become U+FFFD.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A coordinate with at most one decimal; anything not finite becomes 0.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "0".into();
    }
    let s = format!("{:.1}", v + 0.0);
    match s.strip_suffix(".0") {
        Some(whole) if whole != "-0" => whole.to_string(),
        Some(_) => "0".into(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_replaces_markup_and_control_characters() {
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("x\u{1}y"), "x\u{FFFD}y");
        assert_eq!(escape("MiB · ≤"), "MiB · ≤");
    }

    #[test]
    fn num_rounds_and_drops_a_zero_fraction() {
        assert_eq!(num(12.0), "12");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(-0.01), "0");
        assert_eq!(num(f64::NAN), "0");
    }

    #[test]
    fn writer_closes_elements_in_order() {
        let mut svg = Svg::new(10, 20);
        svg.open(El::new("g").attr("id", "a&b"));
        svg.text(El::new("text").num("x", 1.25), "<hi>");
        svg.leaf(El::new("rect"));
        let doc = svg.finish();
        assert!(doc.contains("<g id=\"a&amp;b\">"), "{doc}");
        assert!(doc.contains(">&lt;hi&gt;</text>"), "{doc}");
        let g_close = doc.find("</g>").unwrap_or(0);
        assert!(g_close > doc.find("<rect/>").unwrap_or(usize::MAX));
        assert!(doc.trim_end().ends_with("</svg>"));
    }
}
