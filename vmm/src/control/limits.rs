//! How many clients the control plane serves, what each may leave queued,
//! and the deadlines it holds them to (enforced in `deadlines`, written down
//! in docs/PROTOCOL.md, "Limits").

use std::time::Duration;

/// Clients served at once. When full, the longest-idle client with nothing
/// outstanding is closed to admit a new one; only if every client is busy is
/// the new one refused.
pub const MAX_CLIENTS: usize = 64;

/// Slots past [`MAX_CLIENTS`] kept for the operator: when every client is busy
/// (none can be evicted), a new client still gets in, to negotiate and ask
/// `query-status`, `query-version` or `quit` only.
pub const RESERVED_CLIENTS: usize = 4;
/// Event bytes (beyond the reply being sent) a client may leave unread
/// before it is dropped.
pub(crate) const MAX_QUEUED_BYTES: usize = 4 << 20;
/// Output bytes queued for all clients together past which a large reply
/// (over [`LARGE_REPLY`]) is refused with a `GenericError` instead of being
/// queued: clients that ask for pages and do not read them cannot hold more
/// than this (plus one page) of the VMM's memory.
pub const MAX_TOTAL_QUEUED: usize = 64 << 20;
/// Replies at least this large count against [`MAX_TOTAL_QUEUED`]; smaller
/// ones (`query-status`, errors) are always sent.
pub(crate) const LARGE_REPLY: usize = 64 << 10;
/// Fds a client may leave unreceived before it is dropped.
pub(crate) const MAX_QUEUED_FDS: usize = 512;

/// The deadlines the control plane holds clients to (see `deadlines`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From connecting to a successful `qmp_capabilities`.
    pub handshake: Duration,
    /// From the first byte of a request to its last.
    pub request: Duration,
    /// Queued output that does not move for this long drops the client.
    pub send: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshake: Duration::from_secs(10),
            request: Duration::from_secs(10),
            send: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// How often deadlines are checked: often enough to hold each within a
    /// quarter of itself, at most every 10 ms, at least every second.
    pub(crate) fn sweep_period(&self) -> Duration {
        let shortest = self.handshake.min(self.request).min(self.send);
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}
