//! Large replies and clients that hang up on them: a reading client gets
//! every sampler point, in pages; clients that ask and hang up cost nothing,
//! and a fresh client is answered meanwhile.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::ServedVm;
use kvmscope::control::commands::{SAMPLES_PAGE, SAMPLES_PAGE_BYTES};
use kvmscope::sampler::SamplerConfig;
use serde_json::json;

const MEM: u64 = 64 << 20;

/// A VMM sampling every millisecond, waited on until its ring holds `points`.
fn sampled_vm(test: &str, points: u64) -> ServedVm {
    sampled_vm_of(test, 2, points)
}

fn sampled_vm_of(test: &str, vcpus: usize, points: u64) -> ServedVm {
    let vm = ServedVm::start_with(test, MEM, vcpus, |c| {
        c.sampler = Some(SamplerConfig {
            interval: Duration::from_millis(1),
            capacity: 8192,
            out: None,
        });
    });
    let mut c = vm.client();
    common::wait_for("sampler points", Duration::from_secs(60), || {
        let (v, _) = c.execute("query-samples", json!({"max": 1})).unwrap();
        (v["last-seq"].as_u64() >= Some(points)).then_some(())
    });
    vm
}

#[test]
fn a_page_of_a_vm_of_many_vcpus_is_cut_at_its_byte_limit() {
    require_kvm!();
    // A point of 12 vCPUs is about 12 KB: 1,024 of them would be 12 MB.
    let vm = sampled_vm_of("page-bytes", 12, 2 * SAMPLES_PAGE as u64);
    let mut c = vm.client();
    let (first, _) = c.execute("query-samples", json!({})).unwrap();
    let len = first.to_string().len();
    let points = first["samples"].as_array().unwrap();
    let seqs: Vec<u64> = points.iter().map(|p| p["seq"].as_u64().unwrap()).collect();
    assert!(
        len <= SAMPLES_PAGE_BYTES + (64 << 10),
        "a page of {len} bytes"
    );
    assert!(
        !seqs.is_empty() && seqs.len() < SAMPLES_PAGE,
        "{} points in the page",
        seqs.len()
    );
    assert_eq!(seqs[0], 1, "the oldest kept");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(first["more"], true, "the rest follows");
    let last = *seqs.last().unwrap();
    let (next, _) = c.execute("query-samples", json!({"since": last})).unwrap();
    assert_eq!(next["samples"][0]["seq"].as_u64(), Some(last + 1));
    // The newest `max`, cut the same way: the newest kept, the rest dropped.
    let (newest, _) = c
        .execute("query-samples", json!({"max": SAMPLES_PAGE}))
        .unwrap();
    let kept = newest["samples"].as_array().unwrap();
    assert!(kept.len() < SAMPLES_PAGE, "{} points", kept.len());
    assert!(newest["dropped"].as_u64().unwrap() >= (SAMPLES_PAGE - kept.len()) as u64);
    let newest_seq = kept.last().unwrap()["seq"].as_u64().unwrap();
    assert!(
        newest_seq > last + (SAMPLES_PAGE as u64),
        "{newest_seq} is among the newest"
    );
}

#[test]
fn a_reading_client_gets_every_sampler_point_in_whole_pages() {
    require_kvm!();
    let vm = sampled_vm("pages", 3 * SAMPLES_PAGE as u64);
    let mut c = vm.client();
    // The sampler goes on adding a point a millisecond, faster than an
    // unoptimised build pages them out: read up to the newest point there was
    // when reading began, and check that `more` said so on every page.
    let (mut since, mut seqs, mut largest, mut target) = (0u64, Vec::new(), 0usize, None);
    loop {
        let (page, _) = c.execute("query-samples", json!({"since": since})).unwrap();
        largest = largest.max(page.to_string().len());
        let target = *target.get_or_insert(page["last-seq"].as_u64().unwrap());
        let points = page["samples"].as_array().unwrap();
        assert!(points.len() <= SAMPLES_PAGE);
        seqs.extend(points.iter().map(|p| p["seq"].as_u64().unwrap()));
        since = *seqs.last().unwrap_or(&since);
        if since >= target || page["more"] == false {
            break;
        }
        assert_eq!(
            page["more"], true,
            "a page short of the newest point says more"
        );
    }
    assert_eq!(seqs.first(), Some(&1), "reading starts at the first point");
    assert!(seqs.len() > 2 * SAMPLES_PAGE, "{} points", seqs.len());
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "points are contiguous"
    );
    // Each page is far larger than a socket buffer, and arrived whole.
    assert!(largest > 256 << 10, "largest page {largest} bytes");
}

#[test]
fn clients_that_ask_for_samples_and_hang_up_do_not_hold_up_a_fresh_client() {
    require_kvm!();
    let vm = sampled_vm("hang-up-flood", 2 * SAMPLES_PAGE as u64);
    let request = br#"{"execute":"qmp_capabilities"}{"execute":"query-samples"}"#;
    for _ in 0..200 {
        let mut s = UnixStream::connect(&vm.socket).unwrap();
        s.write_all(request).unwrap();
    }
    let started = Instant::now();
    let mut c = vm.client();
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "running");
    eprintln!(
        "a fresh client after 200 hang-up query-samples: answered in {:?}",
        started.elapsed()
    );
}
