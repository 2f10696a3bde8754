//! `kvmscope plot` as a user runs it: files in, images out, and errors that
//! name the problem.

mod plot_support;

use std::process::{Command, Output};

use plot_support::{experiment, write_csv, write_jsonl, TempDir};

fn kvmscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvmscope"))
        .args(args)
        .output()
        .expect("run kvmscope")
}

/// `kvmscope plot SERIES -o OUT`.
fn plot(series: &std::path::Path, out: &std::path::Path) -> Output {
    kvmscope(&[
        "plot",
        series.to_str().unwrap_or_default(),
        "-o",
        out.to_str().unwrap_or_default(),
    ])
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn plot_writes_an_svg_from_json_lines() {
    let dir = TempDir::new("cli-svg");
    let (header, points) = experiment();
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let svg = dir.join("run.svg");
    let out = plot(&series, &svg);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).unwrap_or_default();
    // Titled by the VM's name, which the JSON-lines header carries, and the file.
    assert!(text.contains("<svg") && text.contains("test-vm  (run.jsonl)"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("60 samples, 2 vCPUs, 4 phase markers"));
}

/// The image is written beside the old one and renamed over it: the old
/// file is never truncated (a stop mid-write left an empty file where an
/// image was), nothing is left beside it, and a path that is no regular
/// file is written in place.
#[test]
fn plot_replaces_an_image_whole_and_leaves_nothing_beside_it() {
    use std::io::Read as _;
    let dir = TempDir::new("cli-replace");
    let (header, points) = experiment();
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let svg = dir.join("run.svg");
    std::fs::write(&svg, "the old image").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&svg, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut old = std::fs::File::open(&svg).unwrap();
    let out = plot(&series, &svg);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut held = String::new();
    old.read_to_string(&mut held).unwrap();
    assert_eq!(held, "the old image", "the old file was written over");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let mode = std::fs::metadata(&svg).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640, "the old file's mode");
    let names: Vec<_> = std::fs::read_dir(dir.join(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let to_stdout = dir.join("stdout.svg");
    std::os::unix::fs::symlink("/dev/stdout", &to_stdout).unwrap();
    let out = plot(&series, &to_stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("<svg"));
}

/// A stop (SIGTERM) while the image is being written: the image is whole,
/// old or new, and nothing is left beside it. The stop came as soon as the
/// hidden temporary file appeared, and left it behind in every try before
/// the write held stops off.
#[test]
fn a_stop_mid_write_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = TempDir::new("cli-stop-write");
    let (header, mut points) = experiment();
    // Long enough an image (about 1.5 MB) that its write and sync take a while.
    let base = points.clone();
    for round in 1..200u64 {
        points.extend(base.iter().cloned().map(|mut p| {
            p.seq += round * base.len() as u64;
            p.time_s += round as f64 * base.len() as f64 * 0.01;
            p
        }));
    }
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let svg = dir.join("run.svg");
    let names = || -> Vec<String> {
        std::fs::read_dir(dir.join(""))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    for _ in 0..5 {
        std::fs::write(&svg, "the old image").unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvmscope"))
            .args([
                "plot",
                series.to_str().unwrap(),
                "-o",
                svg.to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !names().iter().any(|n| n.ends_with(".tmp"))
            && child.try_wait().unwrap().is_none()
            && started.elapsed() < std::time::Duration::from_secs(60)
        {}
        if child.try_wait().unwrap().is_none() {
            // SAFETY: kill on a child of ours that has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let status = child.wait().unwrap();
        assert!(
            status.success() || status.signal() == Some(libc::SIGTERM),
            "{status:?}"
        );
        let left = names();
        assert_eq!(left.len(), 2, "beside the image: {left:?}");
        let image = std::fs::read_to_string(&svg).unwrap();
        assert!(
            image == "the old image" || image.trim_end().ends_with("</svg>"),
            "a cut image: {} bytes",
            image.len()
        );
    }
}

#[test]
fn a_series_cut_while_it_was_written_is_plotted_up_to_its_last_whole_line() {
    let dir = TempDir::new("cli-cut");
    let (header, points) = experiment();
    let series = dir.join("cut.jsonl");
    write_jsonl(&series, &header, &points);
    let whole = std::fs::read_to_string(&series).unwrap();
    // The last record half written, as by a VMM killed mid-line.
    let cut = &whole[..whole.len() - 40];
    std::fs::write(&series, cut).unwrap();
    let out = plot(&series, &dir.join("cut.svg"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("59 samples, 2 vCPUs"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr(&out).contains("has no end, cut while it was written"),
        "{}",
        stderr(&out)
    );
    // A whole last line without its newline (another tool's file) is kept.
    std::fs::write(&series, whole.trim_end_matches('\n')).unwrap();
    let out = plot(&series, &dir.join("whole.svg"));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("60 samples"),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("cut while it was written"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plot_writes_a_png_of_the_requested_size_from_csv() {
    let dir = TempDir::new("cli-png");
    let (header, points) = experiment();
    let series = dir.join("run.csv");
    write_csv(&series, &header, &points);
    let png = dir.join("run.png");
    let args = [
        "plot",
        series.to_str().unwrap_or_default(),
        "-o",
        png.to_str().unwrap_or_default(),
        "--width",
        "640",
        "--height",
        "400",
    ];
    let out = kvmscope(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::read(&png).unwrap_or_default();
    let info = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .map(|r| (r.info().width, r.info().height));
    assert_eq!(info.ok(), Some((640, 400)));
}

/// Two samples whose times are each finite but whose span is not
/// (-1e308 s to 1e308 s): refused, naming it (the axis' key points were
/// computed for ever, at full CPU).
#[test]
fn times_whose_span_no_axis_holds_are_refused_not_drawn_for_ever() {
    let dir = TempDir::new("cli-span");
    let (header, mut points) = experiment();
    points.truncate(2);
    points[0].time_s = -1e308;
    points[1].time_s = 1e308;
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let out = plot(&series, &dir.join("run.svg"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a span no axis can hold"), "{err}");
}

/// A cell of a series quoted in an error reaches the terminal escaped and
/// cut (a title-setting escape sequence and a cell of megabytes were
/// printed whole).
#[test]
fn a_bad_cell_is_quoted_escaped_and_cut() {
    let dir = TempDir::new("cli-bad-cell");
    let (header, points) = experiment();
    let series = dir.join("run.csv");
    write_csv(&series, &header, &points);
    let text = std::fs::read_to_string(&series).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let hostile = format!("\u{1b}]0;owned\u{7}{}", "x".repeat(1 << 20));
    let row = &mut lines[1];
    let first_cell_end = row.find(',').unwrap();
    row.replace_range(..first_cell_end, &hostile);
    std::fs::write(&series, lines.join("\n") + "\n").unwrap();
    let out = plot(&series, &dir.join("run.svg"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{}", &err[..err.len().min(500)]);
    assert!(
        !err.contains('\u{1b}') && !err.contains('\u{7}'),
        "raw escapes"
    );
    assert!(
        err.contains("\\u{1b}]0;owned"),
        "{}",
        &err[..err.len().min(500)]
    );
    assert!(err.len() < 4096, "{} bytes of error", err.len());
}

/// Samples out of time order (runs joined, a file edited) are drawn in
/// time order, said once: the same image as the sorted series (drawn in
/// file order, the lines went back and forth).
#[test]
fn samples_out_of_time_order_are_drawn_in_time_order_and_said() {
    let (a, b) = (TempDir::new("cli-order-a"), TempDir::new("cli-order-b"));
    let (header, points) = experiment();
    let mut reversed = points.clone();
    reversed.reverse();
    write_jsonl(&a.join("run.jsonl"), &header, &points);
    write_jsonl(&b.join("run.jsonl"), &header, &reversed);
    let sorted = plot(&a.join("run.jsonl"), &a.join("run.svg"));
    let unsorted = plot(&b.join("run.jsonl"), &b.join("run.svg"));
    assert!(
        sorted.status.success() && unsorted.status.success(),
        "{}",
        stderr(&unsorted)
    );
    assert!(
        stderr(&unsorted).contains("not in time order"),
        "{}",
        stderr(&unsorted)
    );
    assert!(!stderr(&sorted).contains("not in time order"));
    let image = |d: &TempDir| std::fs::read(d.join("run.svg")).unwrap();
    assert!(image(&a) == image(&b), "the same chart");
}

/// An image whose directory does not exist: said of the image (the error
/// named the hidden temporary file beside it).
#[test]
fn an_output_in_a_missing_directory_is_named_as_given() {
    let dir = TempDir::new("cli-no-dir");
    let (header, points) = experiment();
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let out = plot(&series, &dir.join("nowhere").join("run.svg"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not exist") && !err.contains(".tmp"),
        "{err}"
    );
}

/// A CSV whose columns a spreadsheet put in another order is refused,
/// naming the first out of place (it was read by place: 8 MiB drawn as
/// about 2 TiB).
#[test]
fn a_csv_with_its_columns_in_another_order_is_refused_naming_them() {
    let dir = TempDir::new("cli-csv-order");
    let (header, points) = experiment();
    let series = dir.join("run.csv");
    write_csv(&series, &header, &points);
    let text = std::fs::read_to_string(&series).unwrap();
    // Swap the pages_4k and pages_2m columns, header and cells alike.
    let swapped: Vec<String> = text
        .lines()
        .map(|l| {
            let mut cells: Vec<&str> = l.split(',').collect();
            cells.swap(2, 3);
            cells.join(",")
        })
        .collect();
    std::fs::write(&series, swapped.join("\n") + "\n").unwrap();
    let out = plot(&series, &dir.join("run.svg"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("column 3 is 'pages_2m' where a series has 'pages_4k'"),
        "{err}"
    );
}

/// A series saved with a byte-order mark (an editor, a spreadsheet) plots
/// as it would without (its header read as no header).
#[test]
fn a_series_with_a_byte_order_mark_plots() {
    let dir = TempDir::new("cli-bom");
    let (header, points) = experiment();
    for name in ["run.jsonl", "run.csv"] {
        let series = dir.join(name);
        if name.ends_with("csv") {
            write_csv(&series, &header, &points);
        } else {
            write_jsonl(&series, &header, &points);
        }
        let text = std::fs::read_to_string(&series).unwrap();
        std::fs::write(&series, format!("\u{feff}{text}")).unwrap();
        let out = plot(&series, &dir.join("run.svg"));
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    }
}

#[test]
fn a_chart_size_out_of_range_is_refused_naming_the_flag() {
    for (flag, value) in [("--width", "400"), ("--height", "10001")] {
        let out = kvmscope(&["plot", "x.csv", "-o", "x.png", flag, value]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(flag) && err.contains("is not in"), "{err}");
    }
}

#[test]
fn plot_to_an_unknown_extension_fails_naming_it() {
    let dir = TempDir::new("cli-ext");
    let (header, points) = experiment();
    let series = dir.join("run.jsonl");
    write_jsonl(&series, &header, &points);
    let out = kvmscope(&[
        "plot",
        series.to_str().unwrap_or_default(),
        "-o",
        "chart.pdf",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unsupported output extension '.pdf'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plot_of_a_missing_file_fails_naming_it() {
    let dir = TempDir::new("cli-missing");
    let missing = dir.join("nope.jsonl");
    let out = kvmscope(&["plot", missing.to_str().unwrap_or_default(), "-o", "x.svg"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cannot read series") && err.contains("nope.jsonl"),
        "{err}"
    );
}

#[test]
fn plot_of_a_malformed_series_fails_naming_the_line() {
    let dir = TempDir::new("cli-bad");
    let series = dir.join("bad.jsonl");
    std::fs::write(&series, "{\"kind\": \"sample\"}\n").unwrap_or_default();
    let out = kvmscope(&[
        "plot",
        series.to_str().unwrap_or_default(),
        "-o",
        dir.join("x.svg").to_str().unwrap_or_default(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "bad.jsonl is not a sampler series (read as JSON lines, since its name does not end in .csv)"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plot_of_a_header_only_series_fails_saying_it_is_empty() {
    let dir = TempDir::new("cli-empty");
    let (header, _) = experiment();
    let series = dir.join("empty.jsonl");
    write_jsonl(&series, &header, &[]);
    let out = kvmscope(&[
        "plot",
        series.to_str().unwrap_or_default(),
        "-o",
        dir.join("x.svg").to_str().unwrap_or_default(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("empty.jsonl has no samples"),
        "{}",
        stderr(&out)
    );
}
