//! Why dirty tracking failed: one error type for the service and its rings,
//! below both (`ring.rs` raises some of it, `mod.rs` the rest).

/// Why dirty tracking failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A ring size that is not a power of two in the accepted range.
    #[error("the dirty ring needs a power-of-two entry count from {min} to {max}, not {entries}")]
    RingSize {
        /// The entry count asked for.
        entries: u32,
        /// The smallest count accepted.
        min: u32,
        /// The largest count accepted.
        max: u32,
    },
    /// KVM refused `KVM_CAP_DIRTY_LOG_RING_ACQ_REL` with this entry count.
    #[error("enabling the dirty ring ({0} entries) on the VM")]
    EnableRing(u32, #[source] kvm_ioctls::Error),
    /// Mapping a vCPU's ring pages from its fd failed (vCPU index given).
    #[error("mapping vCPU {0}'s dirty ring")]
    MapRing(usize, #[source] std::io::Error),
    /// Fetching and clearing the dirty bitmap failed.
    #[error("KVM_GET_DIRTY_LOG")]
    GetLog(#[source] kvm_ioctls::Error),
    /// Handing folded bitmap bits back to KVM (manual protect) failed; the
    /// first page of the chunk is given.
    #[error("KVM_CLEAR_DIRTY_LOG from page {0}")]
    ClearLog(u64, #[source] std::io::Error),
    /// The page map could not be scanned for the pages backed since logging
    /// was turned on (it could be then).
    #[error("PAGEMAP_SCAN over guest RAM, which worked when logging was turned on, failed")]
    Backing,
    /// The page map could not be read for the backing of the pages armed.
    #[error("reading the page map")]
    Pages(#[source] crate::backing::Error),
    /// Handing harvested ring entries back to KVM failed.
    #[error("KVM_RESET_DIRTY_RINGS")]
    ResetRings(#[source] std::io::Error),
    /// Re-registering the memory slot with or without `KVM_MEM_LOG_DIRTY_PAGES`
    /// failed (true: turning it on).
    #[error("turning dirty logging {} on the memory slot", if *.0 { "on" } else { "off" })]
    SetLogging(bool, #[source] kvm_ioctls::Error),
}
