//! `kvmscope migrate --predict` on real KVM: the readiness prediction is
//! asked for the parameters just set, and the report sets it against the
//! migration's outcome field by field. An idle guest moves exactly as
//! predicted, page for page; no timing is asserted.

mod common;

use std::time::Duration;

use common::migration::{guest, Dest};
use common::ServedVm;
use kvmscope::client::migrate::{migrate, MigrateConfig};
use serde_json::Value;

const MEM: u64 = 64 << 20;

fn config(src: &ServedVm, to: &str, json: bool) -> MigrateConfig {
    MigrateConfig {
        socket: src.socket.clone(),
        to: to.to_string(),
        bandwidth: Some(125_000_000),
        max_downtime: Some(Duration::from_millis(300)),
        max_rounds: None,
        predict: true,
        converge: None,
        json,
        stop: None,
    }
}

#[test]
fn migrate_predict_reports_an_idle_guest_page_for_page() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = ServedVm::start("mig-predict-text", MEM, 1);
    guest(&mut src.client(), 0, "touch size=2M");
    let dst = Dest::start("mig-predict-text-d", |_, _| {});
    let mut out = Vec::new();
    assert!(migrate(&config(&src, &dst.uri, false), &mut out).unwrap());
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("pre-copy on a 119.21 MiB/s link (request), downtime limit 300 ms (migration-parameters)"),
        "{text}"
    );
    assert!(text.contains("predicted vs actual:"), "{text}");
    for field in ["duplicate", "normal", "dirty-sync-count"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(field) && l.contains('%'))
            .unwrap_or_else(|| panic!("no {field} line in {text}"));
        assert!(line.ends_with("+0.0 %"), "{line}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains("verdict") && l.ends_with("right")),
        "{text}"
    );
    dst.quit();
}

#[test]
fn migrate_predict_json_holds_predicted_and_actual_per_field() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = ServedVm::start("mig-predict-json", MEM, 1);
    guest(&mut src.client(), 0, "touch size=1M");
    let dst = Dest::start("mig-predict-json-d", |_, _| {});
    let mut out = Vec::new();
    assert!(migrate(&config(&src, &dst.uri, true), &mut out).unwrap());
    let v: Value = serde_json::from_slice(&out).unwrap();
    let p = &v["x-predicted"];
    for field in [
        "transferred",
        "duplicate",
        "normal",
        "dirty-sync-count",
        "total-time",
        "downtime",
    ] {
        assert!(p["fields"][field]["actual"].is_u64(), "{field}: {p}");
        assert!(p["fields"][field]["predicted"].is_u64(), "{field}: {p}");
    }
    assert_eq!(
        p["fields"]["normal"]["predicted"], p["fields"]["normal"]["actual"],
        "{p}"
    );
    assert_eq!(p["converges"]["predicted"], true, "{p}");
    assert_eq!(p["converges"]["actual"], true, "{p}");
    dst.quit();
}
