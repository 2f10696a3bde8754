//! The control plane's client deadlines and eviction: no client, idle or
//! hostile, can keep another out or stall the thread.
//!
//! - A client must negotiate (`qmp_capabilities`) within the handshake
//!   deadline, and finish a request it started within the request deadline.
//! - A client whose output has not moved for the send deadline (it does not
//!   read) is dropped.
//! - A negotiated client may stay idle as long as it likes (QMP tools such as
//!   libvirt hold their monitor connection for the VM's life), but when the
//!   server is full, the longest-idle client with nothing outstanding is
//!   closed to make room, so the operator can always connect.
//! - When even the reserved slots are taken, a client that never negotiated
//!   and has said nothing for a second after connecting is closed to make
//!   room, so that silent connections cannot lock everyone out; failing
//!   that, the client that has held a reserved slot longest (a second at
//!   least), so that clients polling faster than the idle eviction cannot.
//!
//! Each client closed for a deadline gets an error line saying which.

use std::time::{Duration, Instant};

use event_manager::EventOps;

use super::connection::Connection;
use super::plane::Plane;

/// A client must have been idle this long to be closed for a new one, so
/// that a burst of clients connecting together do not close each other.
pub(crate) const EVICT_MIN_IDLE: Duration = Duration::from_secs(1);

impl Plane {
    /// Closes the clients past a deadline (called by the sweep timer).
    pub(super) fn enforce_deadlines(&mut self, ops: &mut EventOps) {
        let now = Instant::now();
        let limits = *self.limits();
        let late: Vec<(u32, String)> = self
            .clients
            .iter()
            .filter_map(|(&token, c)| {
                let past = |t: Instant, d| now.saturating_duration_since(t) >= d;
                let why = if !c.negotiated && past(c.connected, limits.handshake) {
                    format!(
                        "no capabilities negotiation within {:?}; closing",
                        limits.handshake
                    )
                } else if c.wants_input()
                    && c.partial_since.is_some_and(|t| past(t, limits.request))
                {
                    format!(
                        "the request was not completed within {:?}; closing",
                        limits.request
                    )
                } else if now
                    .checked_sub(limits.send)
                    .is_some_and(|t| c.stalled_since(t))
                {
                    format!("the reply was not read within {:?}; closing", limits.send)
                } else {
                    return None;
                };
                Some((token, why))
            })
            .collect();
        for (token, why) in late {
            log::info!("control: client {token}: {why}");
            self.close_with(token, ops, &why);
        }
    }

    /// Closes the longest-idle client that has nothing outstanding (no
    /// request pending or being answered, no subscription), to admit a new
    /// one; false if every client is busy.
    pub(super) fn evict_idlest(&mut self, ops: &mut EventOps) -> bool {
        let now = Instant::now();
        let idlest = self
            .clients
            .iter()
            .filter(|(token, c)| {
                // Idle both ways: negotiated (PROTOCOL.md), nothing to send,
                // nothing sent that the server has not read and acted on.
                c.negotiated
                    && c.wants_input()
                    && now.saturating_duration_since(c.last_active) >= EVICT_MIN_IDLE
                    && !c.has_output()
                    && c.partial_since.is_none()
                    && !c.has_pending_input()
                    && !self.subscribers.contains_key(token)
            })
            .min_by_key(|(_, c)| c.last_active)
            .map(|(&token, _)| token);
        match idlest {
            Some(token) => {
                let why = "closed to make room for a new client (this was the longest idle)";
                log::info!("control: client {token}: {why}");
                self.close_with(token, ops, why);
                true
            }
            None => false,
        }
    }

    /// When every slot, reserved ones included, is taken: closes the client
    /// that connected longest ago of those that never negotiated and sent
    /// nothing unread, at least [`EVICT_MIN_IDLE`] after connecting (a QMP
    /// tool negotiates within milliseconds), to admit a new one; returns
    /// whether one was closed. Without this, clients that connect and say
    /// nothing could fill every slot for the whole handshake deadline, and
    /// reconnect as each is closed.
    pub(super) fn evict_silent(&mut self, ops: &mut EventOps) -> bool {
        let why = "closed to make room for a new client (this one never negotiated)";
        self.evict_oldest(ops, why, |c| {
            !c.negotiated && c.partial_since.is_none() && !c.has_pending_input()
        })
    }

    /// When every slot, reserved ones included, is taken and none can go for
    /// being idle or silent: closes the client that has held a reserved slot
    /// longest, at least [`EVICT_MIN_IDLE`], between its requests. A
    /// reserved slot is for a look and a `quit`, which take milliseconds:
    /// clients that poll more often than the idle eviction allows (68
    /// monitoring agents asking `query-status` every 0.95 s) would otherwise
    /// hold every slot, and keep the operator out, for as long as they poll.
    ///
    /// One between its requests goes first; failing that, one mid-request
    /// or with a reply unread (a reserved slot's requests and replies are a
    /// few bytes: one half-sent, or unread, for a second is not a client at
    /// work), so that clients that send `{` and wait cannot hold them all.
    pub(super) fn evict_reserved(&mut self, ops: &mut EventOps) -> bool {
        let why = "closed to make room for a new client (a reserved slot is held for a second when every slot is busy)";
        self.evict_oldest(ops, why, |c| {
            c.reserved
                && c.wants_input()
                && !c.has_output()
                && c.partial_since.is_none()
                && !c.has_pending_input()
        }) || self.evict_oldest(ops, why, |c| c.reserved)
    }

    /// Closes, saying `why`, the client that connected longest ago of those
    /// `may_go` picks that connected at least [`EVICT_MIN_IDLE`] ago (a burst
    /// of clients connecting together do not close each other); returns
    /// whether there was one.
    fn evict_oldest(
        &mut self,
        ops: &mut EventOps,
        why: &str,
        may_go: impl Fn(&Connection) -> bool,
    ) -> bool {
        let now = Instant::now();
        let Some(token) = self
            .clients
            .iter()
            .filter(|(_, c)| {
                now.saturating_duration_since(c.connected) >= EVICT_MIN_IDLE && may_go(c)
            })
            .min_by_key(|(_, c)| c.connected)
            .map(|(&token, _)| token)
        else {
            return false;
        };
        log::info!("control: client {token}: {why}");
        self.close_with(token, ops, why);
        true
    }
}
