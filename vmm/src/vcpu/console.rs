//! The guest's console (port CONSOLE): each line logged at info level, as
//! the guest wrote it but fit for a terminal, and at most
//! [`LINES_PER_SECOND`] a second per vCPU, so that a guest writing lines as
//! fast as it can exit does not fill the VMM's log (two vCPUs grew it by
//! 85 MB a second).

use std::time::{Duration, Instant};

/// The most console lines a vCPU logs in a second; the rest are counted and
/// said in one line when the next second begins.
pub(crate) const LINES_PER_SECOND: u32 = 20;

/// One vCPU's console lines in the current second.
#[derive(Debug, Default)]
pub(crate) struct ConsoleLog {
    second: Option<Instant>,
    shown: u32,
    dropped: u64,
}

impl ConsoleLog {
    /// Whether a line written at `now` is logged: the last second's lines
    /// not logged are said first, when a new second begins.
    pub(crate) fn admit(&mut self, now: Instant, vcpu: usize) -> bool {
        let new_second = self
            .second
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1));
        if new_second {
            self.flush(vcpu);
            *self = ConsoleLog {
                second: Some(now),
                shown: 0,
                dropped: 0,
            };
        }
        if self.shown < LINES_PER_SECOND {
            self.shown += 1;
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    /// Says how many lines were not logged, if any, and counts from zero:
    /// at the next second's first line, and when the vCPU's thread ends (a
    /// guest that went quiet after a flood, a run stopped in one).
    pub(crate) fn flush(&mut self, vcpu: usize) {
        if self.dropped > 0 {
            log::info!(
                "vcpu{vcpu} console: {} more lines not shown (over {LINES_PER_SECOND} a second)",
                self.dropped
            );
            self.dropped = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_its_lines_per_second_and_counted() {
        let mut log = ConsoleLog::default();
        let t0 = Instant::now();
        let shown = (0..1000).filter(|_| log.admit(t0, 0)).count();
        assert_eq!(shown, LINES_PER_SECOND as usize);
        assert_eq!(log.dropped, 1000 - u64::from(LINES_PER_SECOND));
        // Said at the end too: nothing left to say after.
        let mut ended = ConsoleLog::default();
        for _ in 0..30 {
            ended.admit(t0, 0);
        }
        ended.flush(0);
        assert_eq!(ended.dropped, 0);
        // A new second: counted again from zero.
        assert!(log.admit(t0 + Duration::from_millis(1001), 0));
        assert_eq!((log.shown, log.dropped), (1, 0));
        // Within it, the budget holds.
        let more = (0..100)
            .filter(|_| log.admit(t0 + Duration::from_millis(1500), 0))
            .count();
        assert_eq!(more, LINES_PER_SECOND as usize - 1);
    }
}
