//! Issue 5's whole story from the command line: `kvmscope run --samples-out
//! --metrics-addr` serves a valid metrics page while it runs, and the series it
//! writes is drawn by `kvmscope plot`.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

fn kvmscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvmscope"))
}

/// A page once the workload's last command has started (its phase marker:
/// command 3, `exits`, code 5) and the guest has counted all of it (1,024
/// pages touched, then 10 + 10 exits), so the series holds the touched memory
/// and the final count. (Waiting for the start alone raced the stop: CI's
/// debug build once stopped the guest before its exits were counted.)
fn page_after_the_workload(port: u16) -> Option<String> {
    let page = common::scrape(port)?;
    let phase = common::metric(&page, "kvmscope_guest_phase", &[])?;
    let progress = common::metric(&page, "kvmscope_guest_progress_total", &[])?;
    (phase == ((3 << 8) | kvmscope::abi::CMD_EXITS) as f64 && progress >= 1044.0).then_some(page)
}

#[test]
fn run_exports_a_series_plot_draws_and_a_metrics_page_that_validates() {
    require_kvm!();
    let dir = std::env::temp_dir().join(format!("kvmscope-sampler-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let series = dir.join("series.csv");
    let port = common::free_port();
    let mut child = common::KillOnDrop::new(
        kvmscope()
            .args([
                "run",
                "--memory",
                "64M",
                "--sample-interval",
                "5ms",
                "--samples-out",
            ])
            .arg(&series)
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--name",
                "web-01",
                "--workload",
                "touch size=4M; wait for=1s; exits count=10",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let page = common::wait_for("the metrics page", Duration::from_secs(20), || {
        page_after_the_workload(port)
    });
    // With --metrics-addr the VM stays up for scrapers until a signal.
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = common::wait_for("kvmscope to exit", Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    assert!(status.success(), "run failed");
    common::check_with_promtool(&page);
    // The VM is labelled by its name, which outlives restarts and migrations;
    // the pid is on the info metric.
    assert!(
        page.contains("kvmscope_mapped_bytes{vm=\"web-01\"}"),
        "{page}"
    );
    let pid = format!("kvmscope_info{{vm=\"web-01\",pid=\"{}\"", child.id());
    assert!(page.contains(&pid), "{page}");
    // The guest's own count: the 1,024 pages touched before `exits` began.
    let progress = common::metric(&page, "kvmscope_guest_progress_total", &[]);
    assert!(progress >= Some(1024.0), "{progress:?}");
    let text = std::fs::read_to_string(&series).unwrap();
    let (_, points) = kvmscope::sampler::record::parse_csv(&text).unwrap();
    assert!(points.len() > 20, "{} points", points.len());
    assert!(points.last().unwrap().mapped_bytes() >= 4 << 20);
    assert_eq!(
        points.last().unwrap().vcpus[0].progress,
        1024 + 20,
        "touch, then 10 + 10 exits"
    );
    // `kvmscope plot` is there unless the build left the `plot` feature out.
    if cfg!(feature = "plot") {
        let png = dir.join("series.png");
        let plot = kvmscope()
            .arg("plot")
            .arg(&series)
            .arg("-o")
            .arg(&png)
            .output()
            .unwrap();
        assert!(
            plot.status.success(),
            "{}",
            String::from_utf8_lossy(&plot.stderr)
        );
        assert!(std::fs::read(&png)
            .unwrap()
            .starts_with(b"\x89PNG\r\n\x1a\n"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
