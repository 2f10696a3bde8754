//! The destination's `prefetch` thread: backs pass 0's planned ranges of
//! guest RAM ahead of the stream, so that the kernel's zeroing of fresh
//! memory overlaps the transfer, but never far ahead of it; and `populate`,
//! which backs a range in one call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::GuestAddress;

use super::format;
use crate::memory::GuestMemory;

/// How far the prefetch may run ahead of the pages that have arrived: 32 MiB,
/// a few milliseconds of zeroing, ahead of a stream that moves at most a few
/// GB/s. Further, it would back memory for pages that may yet come as zero
/// runs (a guest that wrote zeros: backed on the source, so planned) and
/// compete with the loading thread for the CPU up to the stop.
const PREFETCH_AHEAD: u64 = 8192;

/// Backs pass 0's planned ranges of guest RAM on a `prefetch` thread while the
/// pages travel, at most [`PREFETCH_AHEAD`] pages ahead of the last one
/// loaded, so that the kernel's zeroing of fresh memory overlaps the transfer;
/// stopped at the end of pass 0, and joined when dropped (whatever ends the load).
pub(super) struct Prefetch {
    shared: Arc<PrefetchShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the loading thread tells the prefetch thread.
struct PrefetchShared {
    stop: AtomicBool,
    /// One past the last page pass 0 has loaded (it goes in ascending order).
    loaded_to: AtomicU64,
    /// Pages that have come with data: the prefetch backs no more than
    /// these and [`PREFETCH_AHEAD`] in all, so a stream that claims a plan
    /// of all RAM and sends zero runs far apart (4 KiB of stream that
    /// backed 4 GB) backs no more than it sent.
    arrived: AtomicU64,
}

impl Prefetch {
    pub(super) fn start(mem: &GuestMemory, ranges: Vec<format::PlanRange>) -> Prefetch {
        const CHUNK: u64 = 512; // pages: 2 MiB per call
        let shared = Arc::new(PrefetchShared {
            stop: AtomicBool::new(false),
            loaded_to: AtomicU64::new(0),
            arrived: AtomicU64::new(0),
        });
        let (mem, ours) = (mem.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                let mut backed = 0u64;
                for r in ranges {
                    let end = r.first + r.count;
                    let mut at = r.first;
                    while at < end {
                        if ours.stop.load(Ordering::Acquire) {
                            return;
                        }
                        let loaded = ours.loaded_to.load(Ordering::Acquire);
                        if at < loaded {
                            // Arrived: normal runs were backed as they were
                            // written, and zero runs need no memory.
                            at = loaded.min(end);
                        } else if at >= loaded.saturating_add(PREFETCH_AHEAD)
                            || backed
                                >= (ours.arrived.load(Ordering::Acquire))
                                    .saturating_add(PREFETCH_AHEAD)
                        {
                            // Far enough ahead: wait for the stream (woken by
                            // `loaded` or `stop`; the timeout only bounds a miss).
                            std::thread::park_timeout(std::time::Duration::from_millis(50));
                        } else {
                            let n = CHUNK.min(end - at);
                            populate(&mem, at, n * format::PAGE_SIZE);
                            at += n;
                            backed += n;
                        }
                    }
                }
            })
            .ok();
        Prefetch { shared, thread }
    }

    /// Pass 0 has loaded every page below `page`, `data` more of them with data.
    pub(super) fn loaded(&self, page: u64, data: u64) {
        self.shared.arrived.fetch_add(data, Ordering::AcqRel);
        self.shared.loaded_to.fetch_max(page, Ordering::AcqRel);
        self.wake();
    }

    /// Tells the thread to stop after its current chunk (joined on drop).
    pub(super) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Backs `bytes` of guest RAM from `page` in one call (MADV_POPULATE_WRITE)
/// rather than one page fault per page as they are written; best effort.
pub(super) fn populate(mem: &GuestMemory, page: u64, bytes: u64) {
    use vm_memory::GuestMemoryBackend as _;
    let Ok(host) = mem.get_host_address(GuestAddress(page * format::PAGE_SIZE)) else {
        return;
    };
    let Ok(bytes) = usize::try_from(bytes) else {
        return;
    };
    // SAFETY: the range lies inside guest RAM (checked against its size by the
    // caller), a mapping `mem` keeps alive; populating only backs it with
    // zeroed pages, which a concurrent writer of the same pages may race with
    // harmlessly (the kernel serialises the faults).
    let _ = unsafe { libc::madvise(host.cast(), bytes, libc::MADV_POPULATE_WRITE) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::Backing;

    fn backed(mem: &GuestMemory) -> u64 {
        let region = crate::memory::region(mem).unwrap();
        crate::backing::classify(region)
            .unwrap()
            .iter()
            .filter(|(_, _, b)| *b == Backing::Data)
            .map(|(_, count, _)| count)
            .sum()
    }

    /// A plan of all RAM and a stream whose runs end far apart but carry no
    /// data (zero runs) backs no more than the prefetch's reach; pages with
    /// data let it go on.
    #[test]
    fn the_prefetch_backs_no_more_than_the_data_that_came_and_its_reach() {
        let pages = 65_536; // 256 MiB
        let mem = crate::memory::create(pages * format::PAGE_SIZE, false).unwrap();
        let before = backed(&mem);
        let p = Prefetch::start(
            &mem,
            vec![format::PlanRange {
                first: 0,
                count: pages,
            }],
        );
        // Zero runs ending an eighth, then a quarter of RAM on: each jump
        // would let the prefetch back its reach again.
        for end in [pages / 8, pages / 4] {
            p.loaded(end, 0);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let reach = PREFETCH_AHEAD + 512;
        let zero_runs = backed(&mem) - before;
        assert!(
            zero_runs <= reach,
            "{zero_runs} pages backed for zero runs, more than the reach of {reach}"
        );
        // Data came (where it was loaded): the prefetch goes on up to its
        // reach beyond the last page loaded.
        p.loaded(pages / 4, PREFETCH_AHEAD);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while backed(&mem) - before < reach && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let with_data = backed(&mem) - before;
        assert!(with_data > reach, "{with_data} pages backed once data came");
        drop(p);
        assert!(backed(&mem) - before <= 2 * reach);
    }
}
