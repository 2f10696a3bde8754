//! `kvmscope::plot` on made-up series: what the SVG holds, edge cases, and the PNG.

mod plot_support;

use kvmscope::plot::{self, ChartOptions, PlotError, RateScale};
use kvmscope::sampler::record::Point;
use plot_support::{experiment, header, vcpu, PHASE_LABELS, SAMPLES};
use resvg::tiny_skia::Pixmap;
use resvg::usvg::roxmltree::{Document, Node};

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

fn by_id<'a>(doc: &'a Document, id: &str) -> Option<Node<'a, 'a>> {
    doc.descendants().find(|n| n.attribute("id") == Some(id))
}

fn texts(doc: &Document) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(str::to_string))
        .collect()
}

/// Vertices of a path's `d`: one per M or L command.
fn path_vertices(d: &str) -> usize {
    d.matches(['M', 'L']).count()
}

#[test]
fn svg_is_well_formed_and_usvg_accepts_it() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    assert!(Document::parse(&svg).is_ok());
    assert!(resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).is_ok());
}

#[test]
fn total_line_has_one_vertex_per_sample() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    let line = by_id(&doc, "total-mapped")
        .and_then(|n| n.attribute("points"))
        .unwrap_or_default();
    assert_eq!(line.split_whitespace().count(), SAMPLES);
}

#[test]
fn rate_lines_exist_for_kvm_and_ours_per_vcpu() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    for id in ["rate-kvm-v0", "rate-ours-v0", "rate-kvm-v1", "rate-ours-v1"] {
        let d = by_id(&doc, id)
            .and_then(|n| n.attribute("d"))
            .unwrap_or_default();
        assert_eq!(path_vertices(d), SAMPLES, "{id}");
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
    let d = by_id(&doc, "rate-kvm-v0")
        .and_then(|n| n.attribute("d"))
        .unwrap_or_default();
    assert_eq!(path_vertices(d), SAMPLES - 2);
    assert_eq!(d.matches('M').count(), 3);
}

#[test]
fn phase_labels_appear_for_each_change() {
    let (_, points) = experiment();
    let rendered = plot::render_svg(&header(2), &points, &opts()).expect("render");
    let doc = Document::parse(&rendered.svg).expect("xml");
    let phases: Vec<_> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("phase"))
        .collect();
    assert_eq!(phases.len(), PHASE_LABELS.len());
    assert_eq!(rendered.markers, PHASE_LABELS.len());
    let labels = texts(&doc);
    for want in PHASE_LABELS {
        assert!(
            labels.iter().any(|l| l == want),
            "no label {want:?} in {labels:?}"
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
fn title_and_subtitle_name_the_file_backend_and_vcpus() {
    let (_, points) = experiment();
    let svg = svg_of(&points, &opts());
    let doc = Document::parse(&svg).expect("xml");
    assert_eq!(
        by_id(&doc, "title").and_then(|n| n.text()),
        Some("series.jsonl")
    );
    let sub = by_id(&doc, "subtitle")
        .and_then(|n| n.text())
        .unwrap_or_default();
    assert!(
        sub.contains("vmx (EPT, tdp_mmu=Y)")
            && sub.contains("2 vCPUs")
            && sub.contains("256 MiB RAM"),
        "{sub}"
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
        by_id(&doc, "title").and_then(|n| n.text()),
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
    assert_eq!(
        doc.descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count(),
        3
    );
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
    assert_eq!(
        doc.descendants()
            .filter(|n| n.has_tag_name("polygon"))
            .count(),
        0
    );
    assert!(texts(&doc).iter().any(|l| l == "1.0 KiB"));
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
    assert!(resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).is_ok());
}

#[test]
fn vcpu_option_draws_only_that_vcpu() {
    let (_, points) = experiment();
    let svg = svg_of(
        &points,
        &ChartOptions {
            vcpu: Some(1),
            ..opts()
        },
    );
    let doc = Document::parse(&svg).expect("xml");
    assert!(by_id(&doc, "rate-kvm-v1").is_some());
    assert!(by_id(&doc, "rate-kvm-v0").is_none());
    assert_eq!(
        doc.descendants()
            .filter(|n| n.attribute("class") == Some("phase"))
            .count(),
        1
    );
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
    let svg = svg_of(
        &points,
        &ChartOptions {
            width: 800,
            height: 500,
            ..opts()
        },
    );
    let png = plot::render_png(&svg).expect("png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let pixmap = Pixmap::decode_png(&png).expect("decode");
    assert_eq!((pixmap.width(), pixmap.height()), (800, 500));
}
