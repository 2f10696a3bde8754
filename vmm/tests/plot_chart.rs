//! `kvmscope::plot` on made-up series: what the SVG holds (read back as XML:
//! the lines by their colour, the labels by their text), edge cases, and the PNG.

mod plot_support;

use kvmscope::plot::{self, rate_color, ChartOptions, PlotError, RGBColor, Rate, RateScale};
use kvmscope::sampler::record::Point;
use plot_support::{experiment, header, vcpu, PHASE_LABELS, SAMPLES};
use roxmltree::Document;

fn opts() -> ChartOptions {
    ChartOptions {
        source: "series.jsonl".into(),
        ..ChartOptions::default()
    }
}

fn svg_of(points: &[Point], opts: &ChartOptions) -> String {
    plot::render_svg(&header(2), points, opts)
        .expect("render")
        .svg
}

/// The colour as the SVG writes it.
fn hex(RGBColor(r, g, b): RGBColor) -> String {
    format!("#{r:02X}{g:02X}{b:02X}")
}

/// Vertices of every line drawn in `color`, one entry per line.
fn lines(doc: &Document, color: RGBColor) -> Vec<usize> {
    let color = hex(color);
    doc.descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(&color))
        .map(|n| {
            n.attribute("points")
                .unwrap_or_default()
                .split_whitespace()
                .count()
        })
        .collect()
}

fn texts(doc: &Document) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

fn count(doc: &Document, tag: &str) -> usize {
    doc.descendants().filter(|n| n.has_tag_name(tag)).count()
}

#[test]
fn svg_is_well_formed_and_declares_the_size() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    let root = doc.root_element();
    assert_eq!(
        (root.attribute("width"), root.attribute("height")),
        (Some("1200"), Some("700"))
    );
}

#[test]
fn total_line_has_one_vertex_per_sample() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    assert_eq!(lines(&doc, plot::TOTAL_COLOR), [SAMPLES]);
}

#[test]
fn rate_lines_exist_for_kvm_and_ours_per_vcpu() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    for vcpu in [0, 1] {
        for rate in [Rate::Kvm, Rate::Ours] {
            let found = lines(&doc, rate_color(vcpu, rate));
            assert_eq!(found, [SAMPLES], "vCPU {vcpu} {rate:?}");
        }
    }
}

#[test]
fn nan_and_infinite_rates_are_skipped_and_break_the_line() {
    let (_, mut points) = experiment();
    points[10].vcpus[0].exits_per_s = f64::NAN;
    points[30].vcpus[0].exits_per_s = f64::INFINITY;
    let svg = svg_of(&points, &opts());
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    let doc = Document::parse(&svg).expect("xml");
    let runs = lines(&doc, rate_color(0, Rate::Kvm));
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(runs.iter().sum::<usize>(), SAMPLES - 2);
}

#[test]
fn phase_labels_appear_for_each_change() {
    let (_, points) = experiment();
    let rendered = plot::render_svg(&header(2), &points, &opts()).expect("render");
    assert_eq!(rendered.markers, PHASE_LABELS.len());
    let doc = Document::parse(&rendered.svg).expect("xml");
    let labels = texts(&doc);
    for want in PHASE_LABELS {
        assert_eq!(
            labels.iter().filter(|l| *l == want).count(),
            1,
            "label {want:?} once in {labels:?}"
        );
    }
}

#[test]
fn byte_axis_reads_mib_for_mebibyte_values() {
    let (_, points) = experiment();
    let doc_text = svg_of(&points, &opts());
    let doc = Document::parse(&doc_text).expect("xml");
    let labels = texts(&doc);
    assert!(labels.iter().any(|l| l == "30 MiB"), "{labels:?}");
    assert!(
        !labels
            .iter()
            .any(|l| l.ends_with("GiB") || l.ends_with("KiB")),
        "{labels:?}"
    );
}

#[test]
fn title_and_subtitle_name_the_vm_file_backend_and_vcpus() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    let labels = texts(&doc);
    assert_eq!(
        labels.first().map(String::as_str),
        Some("test-vm  (series.jsonl)")
    );
    assert!(
        labels.iter().any(|sub| sub.contains("vmx (EPT, tdp_mmu=Y)")
            && sub.contains("2 vCPUs")
            && sub.contains("256 MiB RAM")),
        "{labels:?}"
    );
}

#[test]
fn title_text_is_escaped() {
    let (_, points) = experiment();
    let o = ChartOptions {
        title: Some("<a & \"b\">\u{7}".into()),
        ..opts()
    };
    let svg = svg_of(&points, &o);
    let doc = Document::parse(&svg).expect("xml");
    assert_eq!(
        texts(&doc).first().map(String::as_str),
        Some("<a & \"b\">\u{FFFD}")
    );
}

#[test]
fn empty_series_is_an_error_naming_it() {
    let err = plot::render_svg(&header(1), &[], &opts()).err();
    assert!(
        matches!(&err, Some(PlotError::EmptySeries { name }) if name == "series.jsonl"),
        "{err:?}"
    );
}

#[test]
fn series_without_a_finite_time_is_empty() {
    let points = vec![Point {
        time_s: f64::NAN,
        vcpus: vec![vcpu(0, 1.0, 1.0)],
        ..Point::default()
    }];
    assert!(matches!(
        plot::render_svg(&header(1), &points, &opts()),
        Err(PlotError::EmptySeries { .. })
    ));
}

#[test]
fn one_point_is_drawn_as_dots() {
    let points = vec![Point {
        time_s: 0.5,
        pages_4k: 256,
        vcpus: vec![vcpu(0x101, 10.0, 1.0)],
        ..Point::default()
    }];
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    assert_eq!(count(&doc, "circle"), 3);
    assert!(texts(&doc).iter().any(|l| l == "v0 #1 touch"));
}

#[test]
fn all_zero_series_draws_axes_and_no_areas() {
    let points: Vec<Point> = (0..5)
        .map(|i| Point {
            time_s: f64::from(i),
            vcpus: vec![vcpu(0, 0.0, 0.0)],
            ..Point::default()
        })
        .collect();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    assert_eq!(count(&doc, "polygon"), 0);
    assert!(
        texts(&doc).iter().any(|l| l == "1 KiB"),
        "{:?}",
        texts(&doc)
    );
}

#[test]
fn huge_values_give_finite_coordinates() {
    let points: Vec<Point> = (0..3)
        .map(|i| Point {
            time_s: f64::from(i),
            pages_4k: u64::MAX,
            pages_2m: u64::MAX,
            pages_1g: u64::MAX,
            vcpus: vec![vcpu(u64::MAX, 1e300, f64::MAX)],
            ..Point::default()
        })
        .collect();
    let svg = svg_of(&points, &opts());
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    assert!(Document::parse(&svg).is_ok());
}

#[test]
fn vcpu_option_draws_only_that_vcpu() {
    let (_, points) = experiment();
    let rendered = plot::render_svg(
        &header(2),
        &points,
        &ChartOptions {
            vcpu: Some(1),
            ..opts()
        },
    )
    .expect("render");
    let doc = Document::parse(&rendered.svg).expect("xml");
    assert_eq!(lines(&doc, rate_color(1, Rate::Kvm)), [SAMPLES]);
    assert!(lines(&doc, rate_color(0, Rate::Kvm)).is_empty());
    assert_eq!((rendered.markers, rendered.vcpus), (1, 1));
    assert!(texts(&doc).iter().any(|l| l == "v1 #1 read"));
}

#[test]
fn vcpu_option_beyond_the_series_is_an_error() {
    let (_, points) = experiment();
    let err = plot::render_svg(
        &header(2),
        &points,
        &ChartOptions {
            vcpu: Some(2),
            ..opts()
        },
    )
    .err();
    assert!(
        matches!(err, Some(PlotError::NoSuchVcpu { vcpu: 2, vcpus: 2 })),
        "{err:?}"
    );
}

#[test]
fn linear_rate_scale_labels_thousands() {
    let (_, points) = experiment();
    let svg = svg_of(
        &points,
        &ChartOptions {
            rates: RateScale::Linear,
            ..opts()
        },
    );
    let doc = Document::parse(&svg).expect("xml");
    let labels = texts(&doc);
    assert!(labels.iter().any(|l| l == "80k"), "{labels:?}");
    assert!(labels.iter().any(|l| l == "exits/s"));
}

#[test]
fn size_out_of_range_is_an_error() {
    let (_, points) = experiment();
    let err = plot::render_svg(
        &header(2),
        &points,
        &ChartOptions {
            width: 10,
            ..opts()
        },
    )
    .err();
    assert!(
        matches!(err, Some(PlotError::BadSize { width: 10, .. })),
        "{err:?}"
    );
}

#[test]
fn png_has_the_signature_and_the_requested_size() {
    let (_, points) = experiment();
    let o = ChartOptions {
        width: 800,
        height: 500,
        ..opts()
    };
    let (png, outcome) = plot::render_png(&header(2), &points, &o).expect("png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let info = png::Decoder::new(std::io::Cursor::new(png))
        .read_info()
        .map(|r| (r.info().width, r.info().height));
    assert_eq!(info.ok(), Some((800, 500)));
    assert_eq!(
        (outcome.points, outcome.markers),
        (SAMPLES, PHASE_LABELS.len())
    );
}

#[test]
fn a_series_with_the_guests_progress_gets_a_third_panel_and_one_without_does_not() {
    let (_, mut points) = experiment();
    let plain = Document::parse(&svg_of(&points, &opts()))
        .expect("xml")
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .any(|n| n.text().is_some_and(|t| t.contains("Guest progress")));
    assert!(!plain, "no progress, no panel");
    for (i, p) in points.iter_mut().enumerate() {
        p.vcpus[0].progress_per_s = 1000.0 + i as f64;
    }
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    let texts = texts(&doc);
    assert!(texts.iter().any(|t| t == "Guest progress"), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.starts_with("guest units/s")),
        "{texts:?}"
    );
    // vCPU 0's colour: its KVM exit rate and its progress, a line each; vCPU
    // 1's progress is 0 (a flat line at the axis' floor).
    assert_eq!(lines(&doc, rate_color(0, Rate::Kvm)), [SAMPLES, SAMPLES]);
}

#[test]
fn a_series_whose_vcpus_lost_time_gets_a_panel_of_the_shares_lost() {
    let (_, mut points) = experiment();
    let has_panel = |svg: &str| {
        texts(&Document::parse(svg).expect("xml"))
            .iter()
            .any(|t| t == "vCPU time lost")
    };
    assert!(
        !has_panel(&svg_of(&points, &opts())),
        "nothing lost, no panel"
    );
    // From sample 5 (50 ms) on, vCPU 1 loses 10 % of its time to a stall
    // and sleeps 30 %; vCPU 0 loses nothing.
    let t0 = points[0].time_s;
    for p in points.iter_mut() {
        let ms = ((p.time_s - t0) * 1000.0).round() as u64;
        let from5 = ms.saturating_sub(50);
        p.vcpus[1].stall_ns = from5 * 100_000;
        p.vcpus[1].throttled_ns = from5 * 300_000;
    }
    let svg = svg_of(&points, &opts());
    assert!(has_panel(&svg));
    let doc = Document::parse(&svg).expect("xml");
    // vCPU 1: its stall in its colour (after its exit rate), its time asleep
    // in the lighter shade (after ours): one line each, a vertex a sample but
    // the first (no share before it).
    let stall = lines(&doc, rate_color(1, Rate::Kvm));
    assert_eq!(stall.last(), Some(&(SAMPLES - 1)), "{stall:?}");
    let asleep = lines(&doc, rate_color(1, Rate::Ours));
    assert_eq!(asleep.last(), Some(&(SAMPLES - 1)), "{asleep:?}");
    let texts = texts(&doc);
    assert!(texts.iter().any(|t| t == "vCPU time lost (%)"), "{texts:?}");
}

/// A long series is drawn a pixel column at a time: at most four vertices a
/// column per line (and those shared at the cuts of a wide line), the column's highest and lowest kept (a 30,000-sample
/// series drew a 3.2 MB SVG; a path through the kept points covers the
/// same pixels).
#[test]
fn a_long_series_keeps_each_columns_extremes_not_every_sample() {
    let (_, base) = experiment();
    let n = 40_000u64;
    let points: Vec<Point> = (0..n)
        .map(|i| Point {
            seq: i,
            time_s: i as f64 * 0.001,
            // A saw of period 7 samples: every column spans 0 to 6 pages.
            pages_4k: (i % 7) * 4096,
            pages_2m: 0,
            ..base[0].clone()
        })
        .collect();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    let total = lines(&doc, plot::TOTAL_COLOR);
    let vertices: usize = total.iter().sum();
    // Four a column and the vertices wide lines share where they are cut
    // at sharp turns; one a sample before.
    assert!(vertices <= 6 * 1200, "{vertices} vertices for {n} samples");
    assert!(vertices >= 2 * 600, "every column drawn: {vertices}");
    assert!(svg.len() < 2 << 20, "{} bytes", svg.len());
}
