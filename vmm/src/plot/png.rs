//! Rasterises the chart's SVG with resvg, drawing text with the system's fonts.
//! Without any font the shapes still render; a warning says the text is missing.

use std::borrow::Cow;
use std::sync::Arc;

use resvg::tiny_skia::{Color, Pixmap, Transform};
use resvg::usvg::{self, fontdb};

use super::PlotError;

/// Families the chart asks for, best first; the first one installed also
/// stands in for the generic `sans-serif`.
const PREFERRED_FAMILIES: [&str; 3] = ["DejaVu Sans", "Liberation Sans", "Noto Sans"];

/// Renders `svg` to PNG bytes at the size the SVG declares, on white.
///
/// # Errors
/// The SVG does not parse, the image cannot be allocated or encoded.
pub fn render_png(svg: &str) -> Result<Vec<u8>, PlotError> {
    rasterize(svg, system_fonts())
}

/// The fonts fontconfig knows about; warns when there are none.
fn system_fonts() -> fontdb::Database {
    let mut db = fontdb::Database::new();
    db.load_system_fonts();
    if db.is_empty() {
        log::warn!("no system fonts found, so the PNG has no text; install a font package such as fonts-dejavu-core");
        return db;
    }
    let installed = |family: &str| {
        db.faces()
            .any(|f| f.families.iter().any(|(name, _)| name == family))
    };
    let fallback = db
        .faces()
        .next()
        .and_then(|f| f.families.first())
        .map(|(name, _)| name.clone());
    let family = PREFERRED_FAMILIES
        .iter()
        .find(|f| installed(f))
        .map(|f| f.to_string())
        .or(fallback);
    if let Some(family) = family {
        db.set_sans_serif_family(family);
    }
    db
}

fn rasterize(svg: &str, fonts: fontdb::Database) -> Result<Vec<u8>, PlotError> {
    let svg = if fonts.is_empty() {
        Cow::Owned(without_text(svg))
    } else {
        Cow::Borrowed(svg)
    };
    let opt = usvg::Options {
        fontdb: Arc::new(fonts),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(&svg, &opt).map_err(PlotError::ParseSvg)?;
    let size = tree.size().to_int_size();
    let (width, height) = (size.width(), size.height());
    let mut pixmap =
        Pixmap::new(width, height).ok_or(PlotError::AllocateImage { width, height })?;
    pixmap.fill(Color::WHITE);
    resvg::render(&tree, Transform::identity(), &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| PlotError::EncodePng(e.to_string()))
}

/// `svg` less its text elements (one per line, as `svg::Svg` writes them):
/// with no font to draw them, usvg would warn once per label.
fn without_text(svg: &str) -> String {
    let keep = |line: &&str| {
        let t = line.trim_start();
        !(t.starts_with("<text") && t.ends_with("</text>"))
    };
    svg.lines().filter(keep).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SQUARE: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" width="40" height="30">
        <rect x="10" y="10" width="10" height="10" fill="#ff0000"/>
        <text x="2" y="28">no font</text></svg>"##;

    #[test]
    fn rasterize_without_fonts_still_draws_shapes() {
        let png = rasterize(SQUARE, fontdb::Database::new()).unwrap_or_default();
        let pixmap = Pixmap::decode_png(&png).ok();
        let pixel = pixmap
            .as_ref()
            .and_then(|p| p.pixel(15, 15))
            .map(|c| (c.red(), c.green(), c.blue()));
        assert_eq!(pixel, Some((255, 0, 0)));
        assert_eq!(pixmap.map(|p| (p.width(), p.height())), Some((40, 30)));
    }

    #[test]
    fn without_text_drops_only_whole_text_lines() {
        let svg = "<svg>\n  <text x=\"1\">a</text>\n  <rect/>\n  <g><text>b</text></g>\n</svg>";
        assert_eq!(
            without_text(svg),
            "<svg>\n  <rect/>\n  <g><text>b</text></g>\n</svg>"
        );
    }

    #[test]
    fn rasterize_rejects_text_that_is_not_svg() {
        assert!(matches!(
            rasterize("<html/>", fontdb::Database::new()),
            Err(PlotError::ParseSvg(_))
        ));
    }
}
