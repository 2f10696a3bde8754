//! Dirty-page tracking as a VMM service: KVM's dirty bitmap
//! (`KVM_GET_DIRTY_LOG`) or dirty ring (`KVM_CAP_DIRTY_LOG_RING`, per vCPU),
//! folded into the page sets of any number of consumers.
//!
//! A consumer ([`Consumer`], from [`DirtyLog::subscribe`]) sees every page
//! dirtied since its own last look, whatever the others do: a readiness
//! window and a migration can run at once. A VM uses the mode it was started
//! with. Logging itself is a flag of the memory slot
//! (`KVM_MEM_LOG_DIRTY_PAGES`), set by re-registering the slot: a bitmap VM
//! sets it at boot (a page costs one write-protection fault until the first
//! harvest, nothing after, and "written since boot" is known); a ring VM, and
//! one started without a mode (which gets the bitmap), set it only while a
//! consumer holds the log and clear it when the last one goes, so that a VM
//! nobody observes pays nothing. The ring capability stays enabled for the
//! VM's life (KVM allows it only before vCPUs exist); KVM refuses the bitmap
//! once the ring is on (this kernel has no
//! `KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP`), so a ring VM always uses its ring.
//! Turning the bitmap on at run time with initially-set bits clears (and so
//! protects) only the pages that hold data; the bits of the others stay set
//! and are told apart from writes at each fold (`unbacked.rs`).
//!
//! Users: the VM (`vm.rs`) builds it, vCPU threads harvest a full ring,
//! readiness and migration subscribe. It depends on nothing above it.

mod arming;
pub(crate) mod bitmap;
mod error;
pub mod protect;
pub(crate) mod ring;
mod unbacked;

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend as _, GuestMemoryRegion as _};
use vmm_sys_util::ioctl::ioctl;

use crate::memory::{self, GuestMemory};
pub(crate) use bitmap::Bitmap;
pub use error::Error;
pub use protect::Protection;
use unbacked::Unbacked;

/// Which dirty tracking a VM uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyMode {
    /// KVM_MEM_LOG_DIRTY_PAGES and KVM_GET_DIRTY_LOG (one bitmap per VM).
    Bitmap,
    /// The dirty ring with this many entries per vCPU (a power of two).
    Ring(u32),
}

impl std::fmt::Display for DirtyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirtyMode::Bitmap => write!(f, "bitmap"),
            DirtyMode::Ring(n) => write!(f, "ring ({n} entries)"),
        }
    }
}

/// The macro makes a `pub fn`; this module keeps the ioctl number out of the
/// crate's API.
mod nr {
    vmm_sys_util::ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, kvm_bindings::KVMIO, 0xc7);
}
use nr::KVM_RESET_DIRTY_RINGS;

/// What a fold does to the pages it harvests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protect {
    /// Protects them again, so that their next write is logged (a consumer
    /// goes on looking).
    Again,
    /// Leaves them writable where the log allows it (nobody goes on looking).
    Leave,
}

/// The pages one consumer has not looked at yet.
#[derive(Debug, Clone)]
pub struct Window {
    /// Pages dirtied since the consumer's last [`Consumer::take`] (or since it subscribed).
    pub(crate) pages: Bitmap,
    /// Ring entries harvested per vCPU in the same span (ring mode; zeros otherwise).
    pub per_vcpu: Vec<u64>,
    /// Set by the consumer's last look when nobody else holds the log: the
    /// distinct pages it left writable (written since their last
    /// protection). Every other page the guest had mapped stays
    /// write-protected after the log is let go, and faults once when the
    /// guest writes it next.
    pub(crate) left_writable: Option<u64>,
}

impl Window {
    fn new(pages: u64, vcpus: usize) -> Self {
        Window {
            pages: Bitmap::new(pages),
            per_vcpu: vec![0; vcpus],
            left_writable: None,
        }
    }

    fn record(&mut self, vcpu: usize, page: u64) {
        self.pages.set(page);
        if let Some(c) = self.per_vcpu.get_mut(vcpu) {
            *c += 1;
        }
    }
}

struct State {
    rings: Vec<ring::Ring>,
    /// Pages written since tracking began (boot, for a VM started with a mode).
    since_start: Bitmap,
    consumers: Vec<(u64, Window)>,
    next_id: u64,
    /// Consumers holding logging on (every consumer, unless the VM logs from
    /// boot: the bitmap mode).
    holders: u32,
    /// The slot is registered with KVM_MEM_LOG_DIRTY_PAGES.
    logging: bool,
    /// Pages the host had not backed when logging was turned on with
    /// initially-set bits, whose bits were left set (`unbacked.rs`).
    unbacked: Option<Unbacked>,
    /// Chunks of [`protect::CHUNK_PAGES`] whose initially-set bits are not
    /// cleared yet, by index (`arming.rs`); empty once every one is.
    unarmed: Vec<bool>,
}

/// A VM's dirty tracking, shared by the vCPU threads (ring-full exits) and consumers.
pub struct DirtyLog {
    configured: Option<DirtyMode>,
    /// How the bitmap is re-protected (a ring VM has no bitmap).
    protection: Protection,
    /// The `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` flags the kernel offers.
    offered: u32,
    vm: Arc<VmFd>,
    /// Guest RAM, kept mapped for as long as the slot may be re-registered.
    mem: GuestMemory,
    pages: u64,
    vcpus: usize,
    state: Mutex<State>,
    /// Ring entries harvested from each vCPU's ring since boot, whoever
    /// harvested them (the dirty limit's count, read without the lock).
    harvested: Vec<AtomicU64>,
}

/// Slot `slot`'s registration for `region` of guest RAM (the slots are the
/// regions' indexes: a handful, far below KVM's 16-bit slot numbers).
pub(crate) fn slot_region(
    slot: usize,
    region: &vm_memory::GuestRegionMmap<()>,
    logging: bool,
) -> kvm_userspace_memory_region {
    kvm_userspace_memory_region {
        slot: u32::try_from(slot).unwrap_or(u32::MAX),
        flags: if logging { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
        guest_phys_addr: region.start_addr().0,
        memory_size: region.len(),
        userspace_addr: region.as_ptr() as u64,
    }
}

/// Enables the dirty ring on a VM; call before creating vCPUs.
///
/// # Errors
/// A bad size, or KVM refuses.
pub(crate) fn enable_ring(vm: &VmFd, entries: u32) -> Result<(), Error> {
    ring::enable(vm, entries)
}

impl DirtyLog {
    /// Tracking for a VM whose RAM (`mem`, one slot) is already registered
    /// with KVM, with logging on if `configured` is the bitmap, and with
    /// `protection` enabled ([`protect::enable`], before registering);
    /// `vcpu_fds` are needed in ring mode. Call before any vCPU runs: a
    /// bitmap VM's initially-set bits are cleared here, so that "written
    /// since boot" counts from here.
    ///
    /// # Errors
    /// A ring cannot be mapped, or the initial clear failed.
    pub(crate) fn new(
        configured: Option<DirtyMode>,
        protection: Protection,
        vm: Arc<VmFd>,
        mem: &GuestMemory,
        vcpu_fds: &[File],
    ) -> Result<Arc<DirtyLog>, Error> {
        let rings = match configured {
            Some(DirtyMode::Ring(entries)) => vcpu_fds
                .iter()
                .enumerate()
                .map(|(i, fd)| ring::Ring::map(i, fd, entries))
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        let pages = memory::size(mem) / 4096;
        let state = State {
            rings,
            since_start: Bitmap::new(pages),
            consumers: Vec::new(),
            next_id: 0,
            holders: 0,
            logging: configured == Some(DirtyMode::Bitmap),
            unbacked: None,
            unarmed: Vec::new(),
        };
        let offered = protect::offered(&vm);
        let log = DirtyLog {
            configured,
            protection,
            offered,
            vm,
            mem: mem.clone(),
            pages,
            vcpus: vcpu_fds.len(),
            state: Mutex::new(state),
            harvested: vcpu_fds.iter().map(|_| AtomicU64::new(0)).collect(),
        };
        if log.logs_from_boot() && protection == Protection::INITIALLY_SET {
            // Before any vCPU runs, every bit at once: a VM that logs from
            // boot would pay `arm`'s page map scan at every fold for its life.
            protect::clear_all(&log.vm, 0, log.pages)?;
        }
        match configured {
            Some(DirtyMode::Ring(_)) => log::info!("dirty log: {}", log.mode()),
            _ => log::info!(
                "dirty log: bitmap{}, {protection} (kernel offers manual-protect flags {offered:#x})",
                if log.logs_from_boot() { " from boot" } else { " while observed" },
            ),
        }
        Ok(Arc::new(log))
    }

    /// How the bitmap is re-protected after a read; `None` for a ring VM.
    pub fn protection(&self) -> Option<Protection> {
        (!matches!(self.configured, Some(DirtyMode::Ring(_)))).then_some(self.protection)
    }

    /// The `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` flags the kernel offers on
    /// this VM (`KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE` 1,
    /// `KVM_DIRTY_LOG_INITIALLY_SET` 2), whether or not they are used.
    pub fn offered(&self) -> u32 {
        self.offered
    }

    /// The mode the VM was started with, if any.
    pub(crate) fn configured(&self) -> Option<DirtyMode> {
        self.configured
    }

    /// The ring's size in entries, for a VM started with a ring.
    pub(crate) fn ring_size(&self) -> Option<u32> {
        match self.configured {
            Some(DirtyMode::Ring(n)) => Some(n),
            _ => None,
        }
    }

    /// The mode consumers get: the configured one, or the bitmap turned on at run time.
    pub(crate) fn mode(&self) -> DirtyMode {
        self.configured.unwrap_or(DirtyMode::Bitmap)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// Whether the slot is logged from boot whoever looks: only in bitmap
    /// mode, where a page costs one write-protection fault until the first
    /// harvest and nothing after. A ring VM logs only while a consumer holds
    /// the log, since a ring must be reset as it fills, which write-protects
    /// again every page written since: it would pay all the time.
    pub(crate) fn logs_from_boot(&self) -> bool {
        self.configured == Some(DirtyMode::Bitmap)
    }

    /// A new consumer, whose window starts now (what KVM logged before is
    /// folded into the others first). Turns logging on if nobody held it
    /// (a ring VM, or a VM started without a mode, which gets the bitmap).
    ///
    /// # Errors
    /// The KVM call that failed.
    pub fn subscribe(self: &Arc<Self>) -> Result<Consumer, Error> {
        self.subscribe_armed(true)
    }

    /// Like [`subscribe`](DirtyLog::subscribe), but where this consumer turns
    /// a bitmap with initially-set bits on, nothing is protected yet: the
    /// consumer arms the pages a range at a time with [`Consumer::arm`] and
    /// reads them after (a migration's first pass, which sends every page
    /// anyway, so that turning logging on stalls nothing). A fold before
    /// every range is armed arms the rest first, whoever asks (the arming
    /// consumer's reads after [`Consumer::arm`] still come after).
    ///
    /// # Errors
    /// The KVM call that failed.
    pub fn subscribe_unarmed(self: &Arc<Self>) -> Result<Consumer, Error> {
        self.subscribe_armed(false)
    }

    fn subscribe_armed(self: &Arc<Self>, armed: bool) -> Result<Consumer, Error> {
        let mut state = self.lock();
        let holds = !self.logs_from_boot();
        // Protected again: the new window must see the next write to every page.
        self.fold(&mut state, Protect::Again)?;
        if holds && state.holders == 0 {
            self.set_logging(true)?;
            state.logging = true;
            if let Err(e) = self.arm(&mut state, armed) {
                // Nobody holds the log: let it go rather than log for no one.
                state.logging = false;
                state.unbacked = None;
                state.unarmed.clear();
                if let Err(off) = self.set_logging(false) {
                    log::warn!("dirty log: {}", crate::error_chain(&off));
                }
                return Err(e);
            }
        }
        if holds {
            state.holders += 1;
        }
        let id = state.next_id;
        state.next_id += 1;
        state
            .consumers
            .push((id, Window::new(self.pages, self.vcpus)));
        Ok(Consumer {
            log: self.clone(),
            id,
            holds,
        })
    }

    /// Pages written since boot, for a VM that logs from boot (the bitmap
    /// mode); `None` otherwise.
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn written_since_boot(&self) -> Result<Option<u64>, Error> {
        if !self.logs_from_boot() {
            return Ok(None);
        }
        let mut state = self.lock();
        // Nobody else looking: a page already counted need not fault again.
        let protect = if state.consumers.is_empty() {
            Protect::Leave
        } else {
            Protect::Again
        };
        self.fold(&mut state, protect)?;
        Ok(Some(state.since_start.count()))
    }

    /// Records a page the VMM itself wrote (KVM logs only the guest's
    /// writes), so that every consumer sends it again.
    pub(crate) fn mark(&self, page: u64) {
        let mut state = self.lock();
        if state.consumers.is_empty() {
            return;
        }
        let State {
            since_start,
            consumers,
            ..
        } = &mut *state;
        record(since_start, consumers, usize::MAX, page);
    }

    /// Harvests one vCPU's full ring (its KVM_EXIT_DIRTY_RING_FULL exit).
    ///
    /// # Errors
    /// The reset ioctl failed.
    pub(crate) fn harvest_vcpu(&self, vcpu: usize) -> Result<u64, Error> {
        let mut state = self.lock();
        let State {
            rings,
            since_start,
            consumers,
            ..
        } = &mut *state;
        let n = rings.get_mut(vcpu).map_or(0, |r| {
            r.harvest(|page| record(since_start, consumers, vcpu, page))
        });
        self.count_harvested(vcpu, n);
        self.reset_rings()?;
        Ok(n)
    }

    /// Ring entries harvested from vCPU `vcpu`'s ring since boot (0 for a
    /// VM without a ring): the pages it dirtied, counted each time it
    /// dirtied one again after a harvest.
    pub(crate) fn ring_entries(&self, vcpu: usize) -> u64 {
        self.harvested
            .get(vcpu)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Ring entries vCPU `vcpu` has produced since boot: those harvested and
    /// those its ring holds now (counted, not taken, so that the ring is not
    /// reset, which would protect its pages again).
    pub(crate) fn ring_entries_now(&self, vcpu: usize) -> u64 {
        self.entries_in(&self.lock(), vcpu)
    }

    fn entries_in(&self, state: &State, vcpu: usize) -> u64 {
        let pending = state.rings.get(vcpu).map_or(0, ring::Ring::pending);
        self.ring_entries(vcpu) + pending
    }

    /// [`DirtyLog::ring_entries_now`] where the log is not busy (a fold may
    /// hold it for milliseconds): for the main loop, which must not wait.
    pub(crate) fn try_ring_entries_now(&self, vcpu: usize) -> Option<u64> {
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::WouldBlock) => return None,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        Some(self.entries_in(&state, vcpu))
    }

    fn count_harvested(&self, vcpu: usize, n: u64) {
        if let Some(c) = self.harvested.get(vcpu) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Folds what KVM logged since the last fold into every consumer, and
    /// protects those pages again or leaves them writable (`protect`).
    /// Returns how many distinct pages it left writable: with
    /// [`Protect::Leave`], a ring's entries since its last reset or a
    /// manual-protect bitmap's bits since their last clear (a whole-slot
    /// bitmap protects what it reads: none); 0 with [`Protect::Again`].
    fn fold(&self, state: &mut State, protect: Protect) -> Result<u64, Error> {
        let State {
            rings,
            since_start,
            consumers,
            logging,
            unbacked,
            unarmed,
            ..
        } = state;
        if !rings.is_empty() {
            // What a fold that leaves pages writable harvests is every page
            // written since the last reset: no other fold leaves entries
            // unreset while a consumer looks.
            let mut left = (protect == Protect::Leave).then(|| Bitmap::new(self.pages));
            for ring in rings.iter_mut() {
                let vcpu = ring.vcpu;
                let n = ring.harvest(|page| {
                    record(since_start, consumers, vcpu, page);
                    if let Some(left) = left.as_mut() {
                        left.set(page);
                    }
                });
                self.count_harvested(vcpu, n);
            }
            // Left: the harvested entries stay marked until the next reset,
            // which protects their pages then (a subscribe resets before it
            // turns logging on, which protects every page anyway).
            return match left {
                None => self.reset_rings().map(|()| 0),
                Some(left) => Ok(left.count()),
            };
        }
        if *logging {
            if protect == Protect::Again && unarmed.contains(&true) {
                // Someone looks before every range is armed: arm the rest
                // (a consumer arming its ranges reads them after anyway).
                // Not for a last look, after which nobody logs.
                self.arm_rest(unbacked.as_mut(), unarmed)?;
            }
            let mut words = self.read_bitmap()?;
            let mut cleared = false;
            let mut failed = None;
            if let Some(unbacked) = unbacked.as_mut() {
                match self.sort_unbacked(unbacked, &mut words, protect) {
                    Ok(done) => cleared = done,
                    // `words` holds every page the failed clear may have
                    // protected: recorded below before the error is told.
                    Err(e) => failed = Some(e),
                }
            }
            since_start.or_words(&words);
            for (_, w) in consumers.iter_mut() {
                w.pages.or_words(&words);
            }
            if let Some(e) = failed {
                return Err(e);
            }
            let manual = matches!(self.protection, Protection::Manual { .. });
            if !cleared && manual && protect == Protect::Again {
                // Folded everywhere: hand back exactly those bits, which
                // write-protects their pages again. Left set, they are
                // read again at the next fold (where `since_start` has them
                // already) and cleared then.
                protect::clear(&self.vm, 0, &words, self.pages)?;
            }
            if manual && protect == Protect::Leave {
                return Ok(words.iter().map(|w| u64::from(w.count_ones())).sum());
            }
        }
        Ok(0)
    }

    /// Leaves in `words` (the bitmap as read) only the writes among the bits
    /// of `unbacked`'s pages: those the host backs now and that were written
    /// (`unbacked.rs`). With `Protect::Again` it clears, in the same calls,
    /// the bits `words` keeps and those of every page backed since, before
    /// it reads their content, and returns true (done clearing).
    fn sort_unbacked(
        &self,
        unbacked: &mut Unbacked,
        words: &mut [u64],
        protect: Protect,
    ) -> Result<bool, Error> {
        let Some(region) = memory::region(&self.mem) else {
            return Ok(false);
        };
        if protect == Protect::Leave {
            // A written page's bit stays set and is read again at the next
            // fold, as any other's; a zero page of a huge one stays in the set.
            let written = unbacked.writes_into(region, words)?;
            unbacked.forget(written);
            return Ok(false);
        }
        let fresh = unbacked.fresh(region)?;
        unbacked.mask(words);
        let mut clear = words.to_vec();
        fresh.all().for_each(|p| unbacked::set_bit(&mut clear, p));
        let cleared = protect::clear(&self.vm, 0, &clear, self.pages);
        unbacked.forget(fresh.all());
        if let Err(e) = cleared {
            // Some chunks were cleared (protected) before the one KVM
            // refused: every page that could be among them goes to the
            // consumers as written, so that none loses a write.
            fresh.all().for_each(|p| unbacked::set_bit(words, p));
            return Err(e);
        }
        // Protected first: a write after this read is logged by KVM.
        fresh
            .written(region)
            .into_iter()
            .for_each(|p| unbacked::set_bit(words, p));
        Ok(true)
    }

    /// Slot 0's dirty bitmap as KVM holds it (`KVM_GET_DIRTY_LOG`: with
    /// manual protect a copy; otherwise KVM clears it and protects the pages).
    fn read_bitmap(&self) -> Result<Vec<u64>, Error> {
        let size = usize::try_from(self.pages * 4096).unwrap_or(usize::MAX);
        self.vm.get_dirty_log(0, size).map_err(Error::GetLog)
    }

    /// Re-registers slot 0 with logging on or off.
    fn set_logging(&self, on: bool) -> Result<(), Error> {
        for (slot, region) in self.mem.iter().enumerate() {
            let region = slot_region(slot, region, on);
            // SAFETY: the region is a live mapping of `self.mem`, which this
            // service keeps mapped for as long as it lives; only the flags change.
            unsafe { self.vm.set_user_memory_region(region) }
                .map_err(|e| Error::SetLogging(on, e))?;
        }
        Ok(())
    }

    fn reset_rings(&self) -> Result<(), Error> {
        // SAFETY: KVM_RESET_DIRTY_RINGS takes no argument; the VM fd is valid.
        let rc = unsafe { ioctl(&*self.vm, KVM_RESET_DIRTY_RINGS()) };
        if rc < 0 {
            return Err(Error::ResetRings(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn unsubscribe(&self, id: u64, holds: bool) -> Result<(), Error> {
        let mut state = self.lock();
        state.consumers.retain(|(i, _)| *i != id);
        if holds {
            state.holders = state.holders.saturating_sub(1);
            if state.holders == 0 && state.logging {
                // What the ring still holds goes to `since_start` only, and
                // its pages stay writable: nobody logs them any more. Logging
                // goes off even if that fails: nobody is left to need it.
                if let Err(e) = self.fold(&mut state, Protect::Leave) {
                    log::warn!(
                        "dirty log: the last look before logging goes off: {}",
                        crate::error_chain(&e)
                    );
                }
                state.logging = false;
                state.unbacked = None;
                state.unarmed.clear();
                self.set_logging(false)?;
            }
        }
        Ok(())
    }
}

fn record(since_start: &mut Bitmap, consumers: &mut [(u64, Window)], vcpu: usize, page: u64) {
    since_start.set(page);
    for (_, w) in consumers.iter_mut() {
        w.record(vcpu, page);
    }
}

/// One reader of the dirty log: it sees every page dirtied since its own last
/// [`take`](Consumer::take). Dropping it ends its subscription (and turns
/// logging off when it was the last to hold it).
pub struct Consumer {
    log: Arc<DirtyLog>,
    id: u64,
    /// It holds logging on (the VM does not log from boot).
    holds: bool,
}

impl Consumer {
    /// Folds what KVM has logged into this consumer's window and gives the
    /// window to `f` (which may reset it).
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn sync<T>(&self, f: impl FnOnce(&mut Window) -> T) -> Result<T, Error> {
        self.look(false, f)
    }

    /// The consumer's last look: [`sync`](Consumer::sync), then gone. Where
    /// no other consumer is left to need them logged, the pages it folds
    /// stay writable (a ring's entries are not reset, a manual-protect
    /// bitmap is not cleared), so that a guest does not fault once more on
    /// every page it wrote while it was watched, after the watching ended
    /// (on this host that doubled a window's cost to a busy writer). A
    /// whole-slot bitmap protects what it reads whatever is asked.
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn finish<T>(self, f: impl FnOnce(&mut Window) -> T) -> Result<T, Error> {
        self.look(true, f)
    }

    /// Folds and hands the window to `f`; `last`: the consumer's last look,
    /// which leaves the pages writable if no other consumer is there (told
    /// under the same lock as the fold, so that none subscribes between).
    fn look<T>(&self, last: bool, f: impl FnOnce(&mut Window) -> T) -> Result<T, Error> {
        let mut state = self.log.lock();
        let protect = if last && state.consumers.len() <= 1 {
            Protect::Leave
        } else {
            Protect::Again
        };
        let writable = self.log.fold(&mut state, protect)?;
        let window = state
            .consumers
            .iter_mut()
            .find(|(i, _)| *i == self.id)
            .map(|(_, w)| w);
        match window {
            Some(w) => {
                if protect == Protect::Leave {
                    w.left_writable = Some(writable);
                }
                Ok(f(w))
            }
            // Unreachable while `self` lives; an empty window is the honest answer.
            None => Ok(f(&mut Window::new(self.log.pages, self.log.vcpus))),
        }
    }

    /// Distinct pages dirtied since the last take, counting what KVM holds
    /// and nobody folded yet, without re-protecting anything where the log
    /// allows it: a ring's published entries are read in place (not reset),
    /// a manual-protect bitmap is copied (not cleared). A whole-slot bitmap
    /// cannot be read without clearing it, so it is folded as
    /// [`sync`](Consumer::sync) does (its pages are protected again).
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn peek_count(&self) -> Result<u64, Error> {
        let log = &self.log;
        let mut state = log.lock();
        // What KVM holds and no window has yet: copied where that protects
        // nothing, folded (protected again) where it cannot be.
        let pending = if !state.rings.is_empty() || !state.logging {
            None
        } else if matches!(log.protection, Protection::Manual { .. }) {
            if state.unarmed.contains(&true) {
                // As a fold would: the bits of chunks not armed are not writes.
                let State {
                    unbacked, unarmed, ..
                } = &mut *state;
                log.arm_rest(unbacked.as_mut(), unarmed)?;
            }
            let mut words = log.read_bitmap()?;
            let region = memory::region(&log.mem);
            if let (Some(unbacked), Some(region)) = (&state.unbacked, region) {
                // The bits left set are not writes; pages backed since and
                // written are (counted, nothing cleared).
                unbacked.writes_into(region, &mut words)?;
            }
            Some(words)
        } else {
            log.fold(&mut state, Protect::Again)?;
            None
        };
        let Some((_, w)) = state.consumers.iter().find(|(i, _)| *i == self.id) else {
            return Ok(0);
        };
        if let Some(words) = pending {
            return Ok(w.pages.count_with_words(&words));
        }
        if state.rings.is_empty() {
            return Ok(w.pages.count());
        }
        let mut seen = w.pages.clone();
        state
            .rings
            .iter()
            .for_each(|r| r.peek(|page| seen.set(page)));
        Ok(seen.count())
    }

    /// The pages dirtied since the last take, leaving the window empty.
    ///
    /// # Errors
    /// The KVM call failed.
    pub fn take(&self) -> Result<Bitmap, Error> {
        let pages = self.log.pages;
        let vcpus = self.log.vcpus;
        self.sync(|w| std::mem::replace(w, Window::new(pages, vcpus)).pages)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Err(e) = self.log.unsubscribe(self.id, self.holds) {
            log::warn!("dirty log: {}", crate::error_chain(&e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_consumer_sees_a_recorded_page() {
        let mut since = Bitmap::new(64);
        let mut consumers = vec![(0, Window::new(64, 2)), (1, Window::new(64, 2))];
        record(&mut since, &mut consumers, 1, 3);
        record(&mut since, &mut consumers, 1, 3);
        consumers[0].1 = Window::new(64, 2);
        record(&mut since, &mut consumers, 0, 4);
        assert_eq!(since.count(), 2);
        assert_eq!(consumers[0].1.pages.count(), 1);
        assert_eq!(consumers[1].1.pages.count(), 2);
        assert_eq!(consumers[1].1.per_vcpu, vec![1, 2]);
    }

    #[test]
    fn modes_print_their_names() {
        assert_eq!(DirtyMode::Bitmap.to_string(), "bitmap");
        assert_eq!(DirtyMode::Ring(4096).to_string(), "ring (4096 entries)");
    }
}
