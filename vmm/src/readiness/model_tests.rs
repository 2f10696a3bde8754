//! Unit tests of the pre-copy model, on hand-worked cases.
use super::*;
use crate::wire::VCPU_BYTES;

/// 100 dirty pages per second.
const LINK: f64 = 411_200.0;

fn no_costs() -> Costs {
    Costs {
        local_rate: 1e12,
        setup: 0.0,
        stop: 0.0,
        stop_per_vcpu: 0.0,
    }
}

fn inputs() -> Inputs {
    Inputs {
        total_pages: 1000,
        nonzero_pages: 400,
        dirty_rate: 0.0,
        growth: Growth::Linear,
        backed_pages: None,
        bandwidth: Some(LINK),
        max_downtime: 0.3,
        vcpus: 1,
        state_extra: 0,
        max_rounds: None,
        stall_per_page: None,
        limited: None,
        costs: no_costs(),
    }
}

fn pages(p: &Prediction) -> Vec<u64> {
    p.rounds.iter().map(|r| r.pages).collect()
}

#[test]
fn pass_zero_costs_a_run_header_for_zero_pages_not_a_header_per_page() {
    // 104 setup + 400 pages + 3 runs (normal, zero, zero) + 1 section header + pass record.
    assert_eq!(pass0_bytes(1000, 400), 104 + 1_638_400 + 48 + 16 + 32);
    // The seed's 16 GiB guest that only booted: 283 pages of data, 1.2 MB, not QEMU's 37 MB.
    assert_eq!(pass0_bytes(4 << 20, 283), 104 + 283 * 4096 + 48 + 16 + 32);
    assert_eq!(pass0_bytes(1000, 0), 104 + 2 * 16 + 16 + 32);
}

#[test]
fn idle_guest_sends_everything_once_and_stops_with_only_the_device_state() {
    let p = predict(&inputs()).unwrap();
    assert_eq!(pages(&p), vec![1000]);
    assert_eq!(p.dirty_sync_count(), 1);
    assert!(p.converges);
    let stop = p.stop_and_copy.unwrap();
    assert_eq!((stop.pages, stop.bytes), (0, 32 + 16 + VCPU_BYTES + 32));
    let stop_bytes = 32 + 16 + VCPU_BYTES + 32;
    assert_eq!(p.total_bytes, 1_638_600 + stop_bytes);
    assert_eq!((p.duplicate, p.normal), (600, 400));
    assert!((p.downtime - stop_bytes as f64 / LINK).abs() < 1e-12);
}

#[test]
fn slow_dirtier_converges_when_the_dirty_pages_fit_the_downtime() {
    // Pass 0: 1 638 600 B at 411 200 B/s = 3.985 s → 40 dirty pages (12 > 0.3 s × 100):
    // pass 1 sends them (164 528 B, 0.4001 s) → 5 dirty pages fit: stop.
    let p = predict(&Inputs {
        dirty_rate: 10.0,
        ..inputs()
    })
    .unwrap();
    assert_eq!(pages(&p), vec![1000, 40]);
    assert_eq!(p.rounds[1].bytes, 40 * 4112 + 16 + 32);
    assert_eq!(p.stop_and_copy.unwrap().pages, 5);
    assert_eq!(p.dirty_sync_count(), 2);
    assert_eq!(p.normal, 400 + 40 + 5);
    assert!(p.converges, "{}", p.reason);
}

#[test]
fn dirtying_faster_than_the_link_never_converges_and_never_stops() {
    // 150 pages/s on a 100 pages/s link: 598 dirty after pass 0, then 898
    // (pass 1 is 2 459 024 B, 5.98 s): growing.
    let p = predict(&Inputs {
        dirty_rate: 150.0,
        ..inputs()
    })
    .unwrap();
    assert!(!p.converges);
    assert_eq!(pages(&p), vec![1000, 598]);
    assert!(
        p.reason.contains("stop shrinking at 898 pages"),
        "{}",
        p.reason
    );
    assert_eq!(p.stop_and_copy, None);
    assert!(p.downtime.is_infinite() && p.total_seconds.is_infinite());
    assert_eq!(p.to_reply().migrate.status, Status::Active);
}

#[test]
fn max_rounds_forces_the_stop_of_a_guest_that_does_not_converge() {
    let p = predict(&Inputs {
        dirty_rate: 150.0,
        max_rounds: Some(2),
        ..inputs()
    })
    .unwrap();
    assert!(!p.converges);
    assert_eq!(p.dirty_sync_count(), 2);
    assert_eq!(p.stop_and_copy.unwrap().pages, 898);
    assert!((p.downtime - p.stop_and_copy.unwrap().seconds).abs() < 1e-12);
    assert_eq!(p.to_reply().migrate.status, Status::Completed);
    assert!(!p.to_reply().migrate.x_converges);
}

#[test]
fn a_diverging_guest_is_sent_pass_after_pass_until_the_round_limit() {
    let p = predict(&Inputs {
        dirty_rate: 150.0,
        max_rounds: Some(4),
        ..inputs()
    })
    .unwrap();
    assert!(!p.converges);
    assert_eq!(p.dirty_sync_count(), 4);
    assert!(
        p.reason.contains("stop shrinking at 898 pages"),
        "{}",
        p.reason
    );
    assert!(p.downtime.is_finite());
}

#[test]
fn writes_over_a_working_set_saturate_it() {
    // 100 pages/s over 100 pages for 1 s: 100·(1 − e^−1) = 63.2 distinct → 64.
    let i = Inputs {
        dirty_rate: 100.0,
        growth: Growth::Uniform(100),
        ..inputs()
    };
    assert_eq!(i.dirtied(1.0), 64);
    assert_eq!(i.dirtied(100.0), 100);
    assert_eq!(
        Inputs {
            growth: Growth::Linear,
            ..i
        }
        .dirtied(1.0),
        100
    );
}

#[test]
fn a_sweep_counts_up_at_its_rate_until_its_set_is_whole() {
    // 100 pages/s sweeping 100 pages: every write a new page until all 100
    // are written, where random writes would have repeated some.
    let i = Inputs {
        dirty_rate: 100.0,
        growth: Growth::Sequential(100),
        ..inputs()
    };
    assert_eq!(i.dirtied(0.5), 50);
    assert_eq!(i.dirtied(1.0), 100);
    assert_eq!(i.dirtied(100.0), 100);
    let uniform = Inputs {
        growth: Growth::Uniform(100),
        ..i
    };
    assert!(uniform.dirtied(0.5) < i.dirtied(0.5));
}

#[test]
fn pass_zero_takes_the_time_to_read_every_backed_page() {
    // 1000 backed pages (zero-filled but for 400) read at 1 MB/s: 4.096 s, over
    // the 1 638 600 bytes' 1.6386 s (the local rate caps the 10 MB/s link).
    let costs = Costs {
        local_rate: 1e6,
        ..no_costs()
    };
    let i = Inputs {
        bandwidth: Some(1e7),
        backed_pages: Some(1000),
        costs,
        ..inputs()
    };
    assert!((i.pass0().seconds - 4.096).abs() < 1e-9);
    assert!(
        (Inputs {
            backed_pages: None,
            ..i
        }
        .pass0()
        .seconds
            - 1.6386)
            .abs()
            < 1e-9
    );
}

#[test]
fn small_working_set_converges_even_when_dirtying_fast() {
    let p = predict(&Inputs {
        dirty_rate: 150.0,
        growth: Growth::Uniform(20),
        ..inputs()
    })
    .unwrap();
    assert!(p.converges);
    assert_eq!(p.stop_and_copy.unwrap().pages, 20);
}

#[test]
fn working_set_over_the_downtime_never_converges_when_dirtying_fast() {
    // 150 writes/s over 50 pages: passes shrink as they get shorter (50, 39,
    // 35, ...) to where a pass dirties as many pages as it sends, 31 (0.31 s
    // on the wire, over 0.3 s).
    let p = predict(&Inputs {
        dirty_rate: 150.0,
        growth: Growth::Uniform(50),
        ..inputs()
    })
    .unwrap();
    assert!(!p.converges);
    assert!(
        p.reason.contains("stop shrinking at 31 pages"),
        "{}",
        p.reason
    );
}

#[test]
fn slower_than_the_link_converges_in_shrinking_passes() {
    let p = predict(&Inputs {
        dirty_rate: 90.0,
        ..inputs()
    })
    .unwrap();
    assert!(p.converges, "{}", p.reason);
    assert!(pages(&p).windows(2).skip(1).all(|w| w[1] < w[0]));
    assert!(p.stop_and_copy.unwrap().pages <= 30);
}

#[test]
fn unlimited_link_runs_at_the_local_rate_and_costs_add_to_the_times() {
    let costs = Costs {
        local_rate: 1e9,
        setup: 0.01,
        stop: 0.002,
        stop_per_vcpu: 0.001,
    };
    let p = predict(&Inputs {
        bandwidth: None,
        vcpus: 4,
        costs,
        ..inputs()
    })
    .unwrap();
    let stop_bytes = 32 + 4 * (16 + VCPU_BYTES) + 32;
    assert!((p.downtime - (stop_bytes as f64 / 1e9 + 0.006)).abs() < 1e-12);
    let total = 0.01 + 1_638_600.0 / 1e9 + p.downtime;
    assert!((p.total_seconds - total).abs() < 1e-12);
    assert_eq!(p.to_reply().migrate.downtime, Some(6));
}

#[test]
fn the_stop_test_counts_whole_milliseconds_as_the_sender_does() {
    // 30 pages at 100 pages/s are 300 ms; with their section header and
    // pass record, the vCPU's state and the trailer, 315.49 ms: 316 whole
    // ones, which fit a 316 ms limit and not a 315 ms one; 31 pages do not.
    let i = Inputs {
        max_downtime: 0.316,
        ..inputs()
    };
    assert!(i.fits(30));
    assert!(!i.fits(31));
    assert!(!Inputs {
        max_downtime: 0.315,
        ..i
    }
    .fits(30));
}

#[test]
fn rejects_nonsense_inputs() {
    let bad = |i: Inputs| predict(&i).unwrap_err();
    assert_eq!(
        bad(Inputs {
            bandwidth: Some(0.0),
            ..inputs()
        }),
        Error::Bandwidth(0.0)
    );
    assert_eq!(
        bad(Inputs {
            max_downtime: -1.0,
            ..inputs()
        }),
        Error::Downtime(-1.0)
    );
    assert!(matches!(
        bad(Inputs {
            dirty_rate: f64::NAN,
            ..inputs()
        }),
        Error::DirtyRate(_)
    ));
    assert_eq!(
        bad(Inputs {
            nonzero_pages: 1001,
            ..inputs()
        }),
        Error::Pages {
            nonzero: 1001,
            total: 1000
        }
    );
}

#[test]
fn the_stall_is_one_fault_per_page_dirtied_in_each_pass_at_the_measured_cost() {
    // As slow_dirtier_...: 40 pages dirtied during pass 0, 5 during pass 1
    // (sent in the stop); 3 us each.
    let p = predict(&Inputs {
        dirty_rate: 10.0,
        stall_per_page: Some(3e-6),
        limited: None,
        ..inputs()
    })
    .unwrap();
    let stall = p.stall.unwrap();
    assert!((stall - 45.0 * 3e-6).abs() < 1e-12, "{stall}");
    assert_eq!(p.to_reply().guest_stall_seconds, Some(stall));
    assert_eq!(p.to_reply().migrate.x_guest_stall_ms, Some(0));
    // Not measured: none; never stopping: no finite figure.
    assert_eq!(
        predict(&Inputs {
            dirty_rate: 10.0,
            ..inputs()
        })
        .unwrap()
        .stall,
        None
    );
    let never = predict(&Inputs {
        dirty_rate: 150.0,
        stall_per_page: Some(3e-6),
        limited: None,
        ..inputs()
    })
    .unwrap();
    assert!(never.stall.unwrap().is_infinite());
    assert_eq!(never.to_reply().guest_stall_seconds, None);
    // An idle guest dirties nothing and loses nothing.
    let idle = predict(&Inputs {
        stall_per_page: Some(3e-6),
        limited: None,
        ..inputs()
    })
    .unwrap();
    assert_eq!(idle.stall, Some(0.0));
    // ... whether or not a window measured a cost per page (one that saw
    // no write could not): the predicted stall is 0, not unknown.
    let unmeasured = predict(&Inputs {
        limited: None,
        ..inputs()
    })
    .unwrap();
    assert_eq!(unmeasured.stall, Some(0.0));
}

#[test]
fn a_limited_vcpu_writes_its_first_slice_then_sleeps_it_off_then_writes_at_its_limit() {
    // Pass 0 takes ~3.985 s. Limited at 10 pages/s with a 10-page burst, a
    // first slice of 120 pages: by 3.985 s it has written max(120, 10 +
    // 39.85) = 120 pages (still asleep), not the 40 the limit alone says.
    let held = Limited {
        rate: 10.0,
        burst: 10.0,
        first: 120.0,
    };
    let p = predict(&Inputs {
        limited: Some(held),
        ..inputs()
    })
    .unwrap();
    assert_eq!(pages(&p)[..2], [1000, 120]);
    // Pass 1 (120 pages, ~1.2 s) ends at ~5.2 s: 62 pages owed are paid off
    // by then (10 + 52 = 62 < 120), so it wrote nothing more: the stop
    // takes what is left, nothing.
    assert_eq!(p.stop_and_copy.unwrap().pages, 0);
    assert!(p.converges, "{}", p.reason);
    // Paid off at 11 s (10 + 10·11 = 120); then the limit's rate.
    assert_eq!(held.between(10.0, 11.0), 0);
    assert_eq!(held.between(20.0, 21.0), 10);
    assert_eq!(held.between(0.0, 0.001), 120, "the first slice at once");
}

#[test]
fn the_stop_test_counts_the_vcpus_state_and_the_costs_beyond_the_bytes() {
    // A 10,000-page/s link: pass 0 takes 10 s and leaves nearly all the
    // guest's 2,000-page set dirty, 200 ms on the wire, within the 300 ms
    // limit: the stop comes after pass 0.
    let writer = Inputs {
        total_pages: 100_000,
        nonzero_pages: 100_000,
        dirty_rate: 1000.0,
        growth: Growth::Uniform(2000),
        bandwidth: Some(LINK * 100.0),
        ..inputs()
    };
    let bare = predict(&writer).unwrap();
    assert!(bare.converges);
    assert_eq!(pages(&bare), [100_000]);
    assert!(bare.stop_and_copy.unwrap().pages > 1900);
    // The same migration with a stop that costs 250 ms beyond its bytes
    // leaves 50 ms for the pages: the sender must take more passes, and
    // the downtime it then predicts stays within the limit.
    let costly = Inputs {
        costs: Costs {
            stop: 0.25,
            ..no_costs()
        },
        ..writer
    };
    let p = predict(&costly).unwrap();
    assert!(p.converges);
    assert!(
        p.rounds.len() > bare.rounds.len(),
        "{:?} against {:?}",
        pages(&p),
        pages(&bare)
    );
    assert!(p.downtime <= 0.3, "{} s", p.downtime);
    // So does a vCPU state that takes 250 ms on the wire (10.28 MB at
    // 41.12 MB/s).
    let queued = Inputs {
        state_extra: 10_280_000,
        ..writer
    };
    let q = predict(&queued).unwrap();
    assert_eq!(pages(&q), pages(&p));
    assert!(q.downtime <= 0.3, "{} s", q.downtime);
}

#[test]
fn a_stop_that_alone_passes_the_limit_waits_for_nothing_dirty() {
    let over = Costs {
        stop: 0.5,
        ..no_costs()
    };
    // An idle guest stops after pass 0 however long its stop takes:
    // another pass would not shorten it (and the limit cannot be met).
    let idle = predict(&Inputs {
        costs: over,
        ..inputs()
    })
    .unwrap();
    assert_eq!(pages(&idle), vec![1000]);
    assert!(idle.downtime > 0.3);
    // It completes, but the limit is not met: not "converges".
    assert!(!idle.converges, "{}", idle.reason);
    assert!(idle.stop_and_copy.is_some());
    assert!(idle.reason.contains("the stop alone"), "{}", idle.reason);
    // A guest that always has a page dirty never fits.
    let busy = predict(&Inputs {
        costs: over,
        dirty_rate: 10.0,
        max_rounds: None,
        ..inputs()
    })
    .unwrap();
    assert!(!busy.converges);
    assert!(busy.reason.contains("the stop alone"), "{}", busy.reason);
}

#[test]
fn a_downtime_limit_of_zero_is_predicted_not_refused() {
    // QEMU takes `downtime-limit` 0: the sender then stops only once a pass
    // leaves nothing dirty, over the limit (any stop takes some time).
    let idle = predict(&Inputs {
        max_downtime: 0.0,
        ..inputs()
    })
    .unwrap();
    assert!(!idle.converges);
    assert!(
        idle.reason.starts_with("nothing is dirty"),
        "{}",
        idle.reason
    );
    let writing = predict(&Inputs {
        max_downtime: 0.0,
        dirty_rate: 100.0,
        ..inputs()
    })
    .unwrap();
    assert!(!writing.converges);
    assert!(
        writing.reason.contains("pages are dirty"),
        "{}",
        writing.reason
    );
}
