//! The chart as PNG: plotters draws it into an RGB buffer, `png` encodes it.
//! Text needs a font file: the system's sans-serif face, found through
//! fontconfig's configuration (fontdb reads it, no C library), is registered
//! with plotters once per process. Without any font the shapes still draw; a
//! warning says the text is missing.

use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::chart::Chart;
use super::error::PlotError;

/// Families tried before fontconfig's own choice for `sans-serif`, so charts
/// look the same wherever one of them is installed.
const PREFERRED_FAMILIES: [&str; 3] = ["DejaVu Sans", "Liberation Sans", "Noto Sans"];

/// Draws `chart` as PNG bytes of `width` x `height` pixels, on white.
///
/// # Errors
/// `PlotError::Draw` if plotters fails, `PlotError::EncodePng` if the
/// encoder does.
pub(super) fn render(
    chart: Chart<'_>,
    width: u32,
    height: u32,
) -> Result<(Vec<u8>, usize), PlotError> {
    let chart = if fonts_registered() {
        chart
    } else {
        chart.without_text()
    };
    // Sizes are at most MAX_SIDE (10,000) a side, checked before this.
    let len = usize::try_from(u64::from(width) * u64::from(height) * 3)
        .map_err(|_| PlotError::AllocateImage { width, height })?;
    let mut rgb = vec![0u8; len];
    let markers = {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        let markers = chart
            .draw(&root)
            .map_err(|e| PlotError::Draw(Box::new(e)))?;
        root.present().map_err(|e| PlotError::Draw(Box::new(e)))?;
        markers
    };
    Ok((encode(&rgb, width, height)?, markers))
}

/// 8-bit RGB pixels as a PNG file.
fn encode(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(PlotError::EncodePng)?;
    writer.write_image_data(rgb).map_err(PlotError::EncodePng)?;
    writer.finish().map_err(PlotError::EncodePng)?;
    Ok(out)
}

/// Whether a regular face is registered as plotters' `sans-serif` (looked up
/// and registered on the first call only).
fn fonts_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let mut db = fontdb::Database::new();
        db.load_system_fonts();
        let regular = register(&db, fontdb::Weight::NORMAL, FontStyle::Normal);
        if regular {
            // Bold text falls back to the regular face without one.
            register(&db, fontdb::Weight::BOLD, FontStyle::Bold);
        } else {
            log::warn!("no system font found, so the PNG has no text; install a font package such as fonts-dejavu-core");
        }
        regular
    })
}

/// Registers the best sans-serif face of `weight` in `db` for `style`.
fn register(db: &fontdb::Database, weight: fontdb::Weight, style: FontStyle) -> bool {
    let mut families: Vec<fontdb::Family<'_>> = PREFERRED_FAMILIES
        .iter()
        .map(|f| fontdb::Family::Name(f))
        .collect();
    families.push(fontdb::Family::SansSerif);
    let query = fontdb::Query {
        families: &families,
        weight,
        ..fontdb::Query::default()
    };
    let Some(id) = db.query(&query) else {
        return false;
    };
    // plotters keeps registered fonts for the life of the process; this runs
    // at most twice per process, so the bytes are leaked on purpose.
    let bytes = db.with_face_data(id, |data, _| data.to_vec());
    let Some(bytes) = bytes else {
        return false;
    };
    register_font("sans-serif", style, Box::leak(bytes.into_boxed_slice())).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_writes_a_png_of_the_given_size() {
        let png = encode(&[255, 0, 0].repeat(6), 3, 2).unwrap_or_default();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let info = decoder
            .read_info()
            .map(|r| (r.info().width, r.info().height));
        assert_eq!(info.ok(), Some((3, 2)));
    }

    #[test]
    fn encode_rejects_a_buffer_of_the_wrong_length() {
        assert!(matches!(
            encode(&[0; 5], 3, 2),
            Err(PlotError::EncodePng(_))
        ));
    }
}
