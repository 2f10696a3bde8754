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
