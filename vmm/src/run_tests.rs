//! Unit tests of `run.rs`.

use super::*;

#[test]
fn a_hold_keeps_the_guest_paused_against_a_user_resume() {
    let mut p = PauseState::default();
    assert_eq!(p.decide(RunRequest::Hold), Ok(Control::Pause));
    assert!(p
        .decide(RunRequest::Resume)
        .unwrap_err()
        .to_string()
        .contains("readiness scan"));
    assert_eq!(p.decide(RunRequest::Release), Ok(Control::Run));
}

#[test]
fn releasing_a_hold_does_not_resume_a_user_pause() {
    let mut p = PauseState::default();
    assert_eq!(p.decide(RunRequest::Pause), Ok(Control::Pause));
    assert_eq!(p.decide(RunRequest::Hold), Ok(Control::Pause));
    assert_eq!(p.decide(RunRequest::Release), Ok(Control::Pause));
    assert_eq!(p.decide(RunRequest::Resume), Ok(Control::Run));
}

#[test]
fn holds_nest_and_extra_releases_are_harmless() {
    let mut p = PauseState::default();
    p.decide(RunRequest::Hold).unwrap();
    p.decide(RunRequest::Hold).unwrap();
    assert_eq!(p.decide(RunRequest::Release), Ok(Control::Pause));
    assert_eq!(p.decide(RunRequest::Release), Ok(Control::Run));
    assert_eq!(p.decide(RunRequest::Release), Ok(Control::Run));
}

#[test]
fn demo_workload_fits_the_smallest_guest() {
    let spec = demo_workload(crate::abi::MIN_MEMORY);
    let arena = boot::arena_size(crate::abi::MIN_MEMORY);
    for c in parse_workload(&spec).unwrap().commands {
        assert!(c.to_guest(arena).is_ok(), "{c}");
    }
}

#[test]
fn the_boot_clock_counts_a_vcpus_time_on_a_cpu_capped_by_the_wall_clock() {
    let limit = Duration::from_secs(5);
    let start = Instant::now();
    let at = |s: u64| start + Duration::from_secs(s);
    let ns = |s: u64| Some(s * 1_000_000_000);
    let mut watch = BootWatch::new(Some(limit), start);
    assert_eq!(watch.wait(at(0)), Duration::from_secs(1));
    assert_eq!(watch.wait(at(5)), Duration::ZERO, "first look at the limit");
    // At 9 s vCPU 0 has run 4 s and vCPU 1 2 s (a busy host): neither is
    // late, and the next look is when vCPU 0 could have run 5 s, not before.
    assert_eq!(watch.late_of(&[(0, ns(4)), (1, ns(2))], false, at(9)), None);
    assert_eq!(watch.wait(at(9)), Duration::from_secs(1));
    assert_eq!(watch.wait(at(10)), Duration::ZERO);
    // vCPU 0 reaches 5 s of its own: every vCPU still waiting is reported.
    assert_eq!(
        watch.late_of(&[(0, ns(5)), (1, ns(2))], false, at(10)),
        Some(vec![0, 1])
    );
    // A pause restarts the clock from the times then; one that cannot be
    // read during the pause keeps the one from before (vCPU 1's 2 s).
    assert_eq!(watch.late_of(&[(1, None)], true, at(11)), None);
    assert_eq!(watch.late_of(&[(1, ns(6))], false, at(20)), None);
    assert_eq!(watch.late_of(&[(1, ns(7))], false, at(21)), Some(vec![1]));
    // Once every vCPU checked in, nobody is ever late, and the loop waits
    // its second.
    assert_eq!(watch.late_of(&[], false, at(22)), None);
    assert_eq!(watch.late_of(&[(1, ns(99))], false, at(99)), None);
    assert_eq!(watch.wait(at(99)), Duration::from_secs(1));
    // A vCPU that does not run, or whose time cannot be read, is late on
    // the wall clock, after BOOT_WALL_FACTOR times the limit; meanwhile
    // the loop looks once a second, not in a spin.
    let mut watch = BootWatch::new(Some(limit), start);
    let wall = 5 * u64::from(BOOT_WALL_FACTOR);
    assert_eq!(watch.late_of(&[(0, ns(0)), (1, None)], false, at(6)), None);
    assert_eq!(watch.wait(at(6)), Duration::from_secs(1));
    assert_eq!(
        watch.late_of(&[(0, ns(0)), (1, None)], false, at(wall - 1)),
        None
    );
    assert_eq!(
        watch.late_of(&[(0, ns(0)), (1, None)], false, at(wall)),
        Some(vec![0, 1])
    );
    // Without a limit, nobody is late.
    let mut off = BootWatch::new(None, start);
    assert_eq!(off.late_of(&[(0, ns(99))], false, at(999)), None);
    assert_eq!(off.wait(at(999)), Duration::from_secs(1));
}
