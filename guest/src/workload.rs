//! The workloads the VMM can ask a vCPU to run (command codes in `abi.rs`).

use crate::abi::*;
use crate::port;

/// Facts the VMM wrote into the mailbox before boot.
pub struct Boot {
    pub arena_base: u64,
    pub arena_size: u64,
    pub mmio_addr: u64,
    pub tsc_khz: u64,
}

/// The mailbox's `progress` counter: one unit of work done, stored at once,
/// so the VMM sees the guest's pace while a command runs.
pub struct Progress {
    at: *mut u64,
    done: u64,
}

impl Progress {
    /// The counter at `at`, which holds `done` now.
    pub fn new(at: *mut u64, done: u64) -> Self {
        Progress { at, done }
    }

    #[inline(always)]
    fn step(&mut self) {
        self.done = self.done.wrapping_add(1);
        // SAFETY: `at` is the progress field of this vCPU's mailbox page.
        unsafe { core::ptr::write_volatile(self.at, self.done) };
    }
}

/// A page range inside the arena, validated.
struct Range {
    first: u64,
    pages: u64,
    stride: u64,
}

fn range(boot: &Boot, offset: u64, bytes: u64, stride: u64) -> Option<Range> {
    let end = offset.checked_add(bytes)?;
    if end > boot.arena_size || offset % PAGE_SIZE != 0 || stride == 0 {
        return None;
    }
    Some(Range {
        first: boot.arena_base + offset,
        pages: bytes.div_ceil(PAGE_SIZE),
        stride,
    })
}

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter (CR4.TSD is clear).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Runs one command; returns its status and result words.
pub fn run(boot: &Boot, cmd: u64, args: &[u64; 6], p: &mut Progress) -> (u64, [u64; 3]) {
    let start = rdtsc();
    let r = match cmd {
        CMD_TOUCH => touch(boot, args, args[3] | 1, p),
        CMD_TOUCH_ZERO => touch(boot, args, 0, p),
        CMD_READ => read(boot, args, p),
        CMD_DIRTY => dirty(boot, args, p),
        CMD_EXITS => Some(exits(boot, args[0], args[1], p)),
        CMD_PANIC => panic!("guest panic requested (argument {})", args[0]),
        CMD_FAULT => fault(),
        CMD_VERIFY => verify(boot, args, p),
        _ => return (STATUS_UNKNOWN_COMMAND, [0; 3]),
    };
    match r {
        Some((a, c)) => (STATUS_OK, [a, rdtsc() - start, c]),
        None => (STATUS_BAD_ARGS, [0; 3]),
    }
}

/// Fills whole pages with `pattern` (mixed with the page address so pages differ),
/// or with zeros when `pattern` is 0.
fn touch(boot: &Boot, args: &[u64; 6], pattern: u64, p: &mut Progress) -> Option<(u64, u64)> {
    let r = range(boot, args[0], args[1], args[2])?;
    let mut written = 0;
    let mut page = 0;
    while page < r.pages {
        let addr = r.first + page * PAGE_SIZE;
        let value = if pattern == 0 { 0 } else { pattern ^ addr };
        let words = addr as *mut u64;
        for w in 0..(PAGE_SIZE / 8) as usize {
            // SAFETY: the page lies inside the arena, identity-mapped and user-writable.
            unsafe { core::ptr::write_volatile(words.add(w), value) };
        }
        written += 1;
        p.step();
        page += r.stride;
    }
    Some((written, 0))
}

/// Counts the pages of a range that do not hold what `touch` (or
/// `touch-zero`, for pattern 0) wrote.
fn verify(boot: &Boot, args: &[u64; 6], p: &mut Progress) -> Option<(u64, u64)> {
    let r = range(boot, args[0], args[1], args[2])?;
    let pattern = args[3];
    let (mut checked, mut bad, mut page) = (0, 0, 0);
    while page < r.pages {
        let addr = r.first + page * PAGE_SIZE;
        let expected = if pattern == 0 {
            0
        } else {
            (pattern | 1) ^ addr
        };
        let words = addr as *const u64;
        let mut same = true;
        for w in 0..(PAGE_SIZE / 8) as usize {
            // SAFETY: the page lies inside the arena, identity-mapped and user-readable.
            same &= unsafe { core::ptr::read_volatile(words.add(w)) } == expected;
        }
        bad += u64::from(!same);
        checked += 1;
        p.step();
        page += r.stride;
    }
    Some((checked, bad))
}

fn read(boot: &Boot, args: &[u64; 6], p: &mut Progress) -> Option<(u64, u64)> {
    let r = range(boot, args[0], args[1], args[2])?;
    let (mut count, mut xor, mut page) = (0, 0, 0);
    while page < r.pages {
        // SAFETY: inside the arena, identity-mapped.
        xor ^= unsafe { core::ptr::read_volatile((r.first + page * PAGE_SIZE) as *const u64) };
        count += 1;
        p.step();
        page += r.stride;
    }
    Some((count, xor))
}

/// xorshift64*: small, fast, and reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Tag in the first word of a page written by `dirty`: marks which run wrote it, so
/// distinct pages can be counted without a bitmap.
const DIRTY_MAGIC: u64 = 0xd1;

fn dirty(boot: &Boot, args: &[u64; 6], progress: &mut Progress) -> Option<(u64, u64)> {
    let r = range(boot, args[0], args[1], 1)?;
    let (rate, us, seed) = (args[2], args[3], args[4]);
    if r.pages == 0 || boot.tsc_khz == 0 {
        return None;
    }
    let tag = (DIRTY_MAGIC << 56) | ((rdtsc() & 0xff_ffff) << 32);
    let mut rng = Rng(seed | 1);
    let ticks_per_ms = boot.tsc_khz;
    // Ticks between writes; rate 0 means unpaced.
    let interval = (ticks_per_ms * 1000)
        .checked_div(rate)
        .map_or(0, |t| t.max(1));
    let start = rdtsc();
    let end = start.saturating_add(us.saturating_mul(ticks_per_ms) / 1000);
    let (mut writes, mut distinct, mut due) = (0u64, 0u64, start);
    loop {
        let now = rdtsc();
        if now >= end {
            break;
        }
        if now < due {
            core::hint::spin_loop();
            continue;
        }
        // Never burst more than a second's worth after a stall (host preemption).
        due = due.max(now.saturating_sub(ticks_per_ms * 1000)) + interval;
        let p = (r.first + (rng.next() % r.pages) * PAGE_SIZE) as *mut u64;
        // SAFETY: `p` is a page inside the arena, identity-mapped and user-writable.
        unsafe {
            if core::ptr::read_volatile(p) & !0xffff_ffff != tag {
                distinct += 1;
            }
            core::ptr::write_volatile(p, tag | (writes & 0xffff_ffff));
        }
        writes += 1;
        progress.step();
    }
    Some((writes, distinct))
}

fn exits(boot: &Boot, ports: u64, mmio: u64, p: &mut Progress) -> (u64, u64) {
    for i in 0..ports {
        port::out(PORT_EXIT_TEST, i as u32);
        p.step();
    }
    for i in 0..mmio {
        // SAFETY: no memory is behind this address: the access exits to the VMM as MMIO.
        unsafe { core::ptr::write_volatile(boot.mmio_addr as *mut u32, i as u32) };
        p.step();
    }
    (ports, mmio)
}

fn fault() -> ! {
    // SAFETY: deliberately raises #UD; with no IDT the vCPU triple-faults.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
