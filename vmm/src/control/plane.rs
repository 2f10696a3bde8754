//! The `control` thread's event-manager subscriber: the listening socket, every
//! client connection, the exit eventfd, the vCPUs' result watcher and a retry
//! timer, each registered with its own token in the event's data.
//!
//! One subscriber holds all of them because accepting a client means adding
//! its fd, which a subscriber can do only for itself (`EventOps::add`).

use std::collections::{HashMap, HashSet};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use serde_json::Value;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::commands::Handler;
use super::connection::{Connection, Input};
use super::events;
use super::limits::{Limits, LARGE_REPLY, MAX_CLIENTS, MAX_TOTAL_QUEUED, RESERVED_CLIENTS};
use super::outcome::{Outcome, Pending};
use crate::protocol::events::{EventKind, ShutdownCause, ShutdownInfo};
use crate::protocol::framing::{Frame, MAX_VALUE};
use crate::protocol::{request, Command, ErrorClass, Event, Message};
use crate::scm;

const LISTENER: u32 = 0;
const EXIT: u32 = 1;
const WATCHER: u32 = 2;
const RETRY: u32 = 3;
const TICKS: u32 = 4;
const SWEEP: u32 = 5;
const WORK: u32 = 6;
const FIRST_CLIENT: u32 = 7;

/// Clients accepted per readiness event of the listener, so a flood of
/// connections cannot starve the clients already there.
const ACCEPTS_PER_EVENT: usize = 32;

/// Requests of one client run per turn; the rest wait for the next turn, so
/// a client that pipelines many cannot hold up the others.
const REQUESTS_PER_TURN: usize = 16;

/// How long accepting pauses when the process is out of fds.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// An error line for client-level failures (no request id).
fn error_line(desc: &str) -> Vec<u8> {
    Message::error(ErrorClass::GenericError, desc, None).to_line()
}

/// The subscriber.
pub(crate) struct Plane {
    listener: UnixListener,
    exit: EventFd,
    watcher: Arc<EventFd>,
    /// Written by the sampler after each tick (never, when it is off).
    ticks: Arc<EventFd>,
    /// Why the VMM stops ([`PlaneFds::cause`]).
    cause: Arc<Mutex<Option<ShutdownCause>>>,
    retry: TimerFd,
    /// Fires a few times a second to enforce the client deadlines.
    sweep: TimerFd,
    /// Written when a client has requests left after its turn.
    work: EventFd,
    handler: Handler,
    limits: Limits,
    pub(super) clients: HashMap<u32, Connection>,
    /// Deferred replies: client, request id, what they wait for.
    waits: Vec<(u32, Option<Value>, Pending)>,
    /// `subscribe-samples` clients and the last point each was sent.
    pub(super) subscribers: HashMap<u32, u64>,
    /// Clients with requests left over from their last turn.
    leftover: HashSet<u32>,
    next_token: u32,
    uid: u32,
    /// The exit eventfd fired: the thread ends after this round of events.
    pub(crate) done: bool,
    /// Clients refused since the last warning about it, and when that was.
    refused: (u64, Option<Instant>),
    /// A `quit` was answered, its `SHUTDOWN` sent before the reply, as
    /// QEMU sends it: the farewell does not say it again.
    said_shutdown: bool,
}

/// At most one warning about refused clients this often (each refusal is
/// logged at info): enough for an operator to see that something holds the
/// socket, not a line per connection a hostile peer makes.
const REFUSED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The fds a plane watches besides its clients.
pub(crate) struct PlaneFds {
    /// The control socket, listening.
    pub(crate) listener: UnixListener,
    /// Written when the VMM stops: the thread ends after this round.
    pub(crate) exit: EventFd,
    /// Written by vCPU threads when a result is recorded (wakes `wait` replies).
    pub(crate) watcher: Arc<EventFd>,
    /// Written by the sampler after each tick (wakes `SAMPLE` subscribers).
    pub(crate) ticks: Arc<EventFd>,
    /// Why the VMM stops, set before `exit` is written: said to every
    /// negotiated client in a `SHUTDOWN` event, as QEMU does.
    pub(crate) cause: Arc<Mutex<Option<ShutdownCause>>>,
}

impl Plane {
    /// The subscriber, from its fds (the bound listener, the exit eventfd,
    /// the vCPUs' result watcher and the sampler's tick eventfd), the command
    /// handler and the client limits.
    ///
    /// # Errors
    /// A timer or eventfd cannot be created.
    pub(crate) fn new(fds: PlaneFds, handler: Handler, limits: Limits) -> std::io::Result<Plane> {
        let timer = || TimerFd::new().map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
        let uid = rustix::process::geteuid().as_raw();
        Ok(Plane {
            listener: fds.listener,
            exit: fds.exit,
            watcher: fds.watcher,
            ticks: fds.ticks,
            cause: fds.cause,
            retry: timer()?,
            sweep: timer()?,
            work: EventFd::new(EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            handler,
            limits,
            clients: HashMap::new(),
            waits: Vec::new(),
            subscribers: HashMap::new(),
            leftover: HashSet::new(),
            next_token: FIRST_CLIENT,
            uid,
            done: false,
            refused: (0, None),
            said_shutdown: false,
        })
    }

    fn accept(&mut self, ops: &mut EventOps) {
        for _ in 0..ACCEPTS_PER_EVENT {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream, ops),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of fds or memory: the listener would stay readable and
                    // spin the loop, so stop listening for a moment.
                    log::warn!(
                        "control: accepting a client failed ({e}); retrying in {ACCEPT_RETRY:?}"
                    );
                    let _ = ops.modify(Events::with_data(
                        &self.listener,
                        LISTENER,
                        EventSet::empty(),
                    ));
                    let _ = self.retry.reset(ACCEPT_RETRY, None);
                    return;
                }
            }
        }
    }

    /// Whether a new client may be served (`Ok(true)`: in a reserved slot),
    /// or why not; with the peer's credentials, read once.
    fn admission(
        &mut self,
        stream: &UnixStream,
        ops: &mut EventOps,
    ) -> Result<(bool, scm::PeerCred), String> {
        let cred = scm::peer_cred(stream)
            .map_err(|e| format!("the peer's credentials are unreadable: {e}"))?;
        match cred.uid {
            uid if uid == self.uid || uid == 0 => {}
            uid if self.uid == 0 => {
                return Err(format!("uid {uid} may not use this socket: only root may"))
            }
            uid => {
                return Err(format!(
                    "uid {uid} may not use this socket: only uid {} and root may",
                    self.uid
                ))
            }
        }
        // Whether the slot free now is a reserved one (every other is taken).
        let in_reserve = |plane: &Plane| {
            let reserved = plane.clients.values().filter(|c| c.reserved).count();
            plane.clients.len() - reserved >= MAX_CLIENTS
        };
        if !in_reserve(self) || self.evict_idlest(ops) {
            return Ok((in_reserve(self), cred));
        }
        // The reserve is for a process that holds no connection here (the
        // operator's `kvmscope ctl`): one that already holds some (a
        // monitoring agent's threads, one retrying as soon as it is
        // refused) would otherwise take each reserved slot as it frees.
        // (This process's own clients, in-process tests, are not held to it.)
        let pid = cred.pid.filter(|&p| p != std::process::id());
        if let Some(holding) = pid
            .map(|pid| {
                self.clients
                    .values()
                    .filter(|c| c.peer_pid == Some(pid))
                    .count()
            })
            .filter(|&n| n > 0)
        {
            return Err(format!(
                "this VMM serves at most {MAX_CLIENTS} clients at once and all are busy; its {RESERVED_CLIENTS} reserved slots are for a process that holds no connection to it, and this one holds {holding}; try again later"
            ));
        }
        if self.clients.values().filter(|c| c.reserved).count() < RESERVED_CLIENTS {
            return Ok((true, cred));
        }
        if self.evict_silent(ops) || self.evict_reserved(ops) {
            return Ok((in_reserve(self), cred));
        }
        Err(format!(
            "this VMM serves at most {MAX_CLIENTS} clients at once (and {RESERVED_CLIENTS} more for query-status and quit) and all are busy; try again later"
        ))
    }

    /// Counts a refused client, and warns about them at most once every
    /// [`REFUSED_WARNING_EVERY`].
    fn warn_refused(&mut self, desc: &str) {
        let (count, last) = &mut self.refused;
        *count += 1;
        if last.is_none_or(|t| t.elapsed() >= REFUSED_WARNING_EVERY) {
            log::warn!(
                "control: refused {count} client(s) since the last such warning; the last: {desc}"
            );
            (*count, *last) = (0, Some(Instant::now()));
        }
    }

    /// Greets an accepted client, or tells it why not and closes.
    fn admit(&mut self, stream: UnixStream, ops: &mut EventOps) {
        let (reserved, cred) = match self.admission(&stream, ops) {
            Ok(admitted) => admitted,
            Err(desc) => {
                log::info!("control: refusing a client: {desc}");
                self.warn_refused(&desc);
                // Best effort: a new socket's buffer is empty, so this short line fits.
                let _ = scm::send_with_fds(&stream, &error_line(&desc), &[]);
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let token = self.next_token;
        self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_CLIENT);
        let mut client = Connection::new(stream);
        client.reserved = reserved;
        client.peer_pid = cred.pid;
        if reserved {
            log::info!("control: every client slot is busy; admitting one to a reserved slot");
        }
        client.queue(
            Message::Greeting(self.handler.greeting()).to_line(),
            Vec::new(),
        );
        // The greeting goes when epoll says the socket is writable; a client
        // that already hung up is then seen to, with what it sent still run.
        let interest = EventSet::IN | EventSet::OUT;
        if ops
            .add(Events::with_data(client.stream(), token, interest))
            .is_err()
        {
            return;
        }
        self.clients.insert(token, client);
        log::debug!(
            "control: client {token} connected ({} now)",
            self.clients.len()
        );
    }

    /// Handles readiness of client `token`.
    fn serve(&mut self, token: u32, set: EventSet, ops: &mut EventOps) {
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        if set.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            return self.hang_up(token, ops, "it hung up");
        }
        if set.contains(EventSet::IN) {
            if let Err(e) = client.read() {
                return self.hang_up(token, ops, &format!("reading failed: {e}"));
            }
        }
        self.pump(token, ops);
    }

    /// Runs a turn of the client's requests, then settles it.
    fn pump(&mut self, token: u32, ops: &mut EventOps) {
        match self.run_requests(token, false) {
            Ok(()) => self.settle(token, ops),
            Err(why) => self.drop_client(token, ops, why),
        }
    }

    /// The peer is gone (or its socket failed): what it sent is still run (a
    /// piped `quit`, say; it is all in the socket buffer, so reading ends),
    /// except queries, whose replies nobody can read, and it is dropped.
    fn hang_up(&mut self, token: u32, ops: &mut EventOps, why: &str) {
        if let Some(client) = self.clients.get_mut(&token) {
            // Stops at the end, or at ECONNRESET if our output went unread.
            while let Ok(Input::Data) = client.read() {}
            // Either way no more will come: a partial last value is dropped.
            client.ended = true;
        }
        let _ = self.run_requests(token, true);
        self.drop_client(token, ops, why);
    }

    /// Runs up to [`REQUESTS_PER_TURN`] of the client's complete requests,
    /// until a deferred reply or a reply being sent holds them. `gone`: the
    /// client hung up, so replies are discarded and queries skipped. `Err`
    /// when it must be dropped.
    fn run_requests(&mut self, token: u32, gone: bool) -> Result<(), &'static str> {
        for _ in 0..REQUESTS_PER_TURN {
            let Some(client) = self.clients.get_mut(&token) else {
                return Ok(());
            };
            if gone {
                client.discard_output();
                client.busy = false;
            }
            let Some(frame) = client.next_frame() else {
                return Ok(());
            };
            match frame {
                Frame::Value(bytes) => self.run_request(token, &bytes, gone),
                Frame::Invalid(why) => {
                    client.queue(error_line(&format!("JSON parse error, {why}")), Vec::new())
                }
                Frame::TooLarge => {
                    let desc = format!("a request may be at most {MAX_VALUE} bytes; closing");
                    client.queue(error_line(&desc), Vec::new());
                    let _ = client.flush();
                    return Err("its request was too large");
                }
            }
        }
        self.schedule(token);
        Ok(())
    }

    /// Gives the client another turn soon, without waiting for its socket.
    fn schedule(&mut self, token: u32) {
        if self.leftover.insert(token) && self.work.write(1).is_err() {
            log::warn!("control: cannot schedule client {token}'s next turn");
        }
    }

    fn run_request(&mut self, token: u32, bytes: &[u8], gone: bool) {
        let negotiated = self.clients.get(&token).is_some_and(|c| c.negotiated);
        let reserved = self.clients.get(&token).is_some_and(|c| c.reserved);
        let (id, outcome) = match request::parse(bytes) {
            Ok(req) if gone && req.command.is_query() => return,
            Ok(req) if reserved && !for_the_reserve(&req.command) => (
                req.id,
                Outcome::Error(
                    ErrorClass::GenericError,
                    format!("every one of the {MAX_CLIENTS} client slots is busy: this reserved slot serves only query-status, query-version and quit"),
                ),
            ),
            Ok(req)
                if matches!(req.command, Command::QuerySamples(_)) && self.over_reply_budget(0) =>
            {
                (req.id, over_budget())
            }
            Ok(req) => {
                let quit = matches!(req.command, Command::Quit(_));
                let outcome = self.dispatch(negotiated, req.command);
                if quit && matches!(outcome, Outcome::Return(..)) {
                    self.say_shutdown();
                }
                (req.id, outcome)
            }
            // As QEMU: before negotiation, a command it does not know, or one
            // it knows with bad arguments, reads as any other command but
            // `qmp_capabilities` (QEMU looks it up in a table of that one
            // before anything else).
            Err(e) if !negotiated && names_another_command(bytes) => (e.id, not_negotiated()),
            Err(e) => (e.id, Outcome::Error(e.class, e.desc)),
        };
        let outcome = match outcome {
            Outcome::Negotiated => {
                if let Some(c) = self.clients.get_mut(&token) {
                    c.negotiated = true;
                }
                Outcome::ret(serde_json::json!({}))
            }
            Outcome::Subscribe { since, reply } => {
                self.subscribers.insert(token, since);
                Outcome::Return(reply, Vec::new())
            }
            Outcome::Unsubscribe => {
                let was = self.subscribers.remove(&token).is_some();
                Outcome::ret(serde_json::json!({"was-subscribed": was}))
            }
            other => other,
        };
        if let Outcome::Wait(w) = outcome {
            self.waits.push((token, id.clone(), w));
            if let Some(c) = self.clients.get_mut(&token) {
                c.busy = true;
            }
            // It may have finished already.
            return self.finish_waits(Some(token));
        }
        self.answer(token, id, outcome);
    }

    /// Capability negotiation as QEMU does it: before `qmp_capabilities`
    /// only it is served; after, it is refused.
    fn dispatch(&mut self, negotiated: bool, command: Command) -> Outcome {
        let capabilities = matches!(command, Command::QmpCapabilities(_));
        match (negotiated, capabilities) {
            (false, true) | (true, false) => self.handler.execute(command),
            (true, true) => Outcome::Error(
                ErrorClass::CommandNotFound,
                "Capabilities negotiation is already complete, command ignored".into(),
            ),
            (false, false) => not_negotiated(),
        }
    }

    /// Whether the output queued for all clients, with `more`, is over
    /// [`MAX_TOTAL_QUEUED`].
    fn over_reply_budget(&self, more: usize) -> bool {
        let queued: usize = self.clients.values().map(Connection::queued_bytes).sum();
        queued.saturating_add(more) > MAX_TOTAL_QUEUED
    }

    /// Queues the reply to a request, after the events that came before it
    /// (QEMU sends `stop`'s STOP before its return: a client that reads
    /// the events it has by a command's reply finds them there). A large
    /// reply while the clients' queued output is over [`MAX_TOTAL_QUEUED`]
    /// becomes an error instead.
    fn answer(&mut self, token: u32, id: Option<Value>, outcome: Outcome) {
        if !self.clients.contains_key(&token) {
            return;
        }
        if !matches!(
            outcome,
            Outcome::Wait(_)
                | Outcome::Subscribe { .. }
                | Outcome::Unsubscribe
                | Outcome::Negotiated
        ) {
            // The other clients that got some send them on their next turn.
            for other in self.queue_events() {
                if other != token {
                    self.schedule(other);
                }
            }
        }
        let (line, fds) = match outcome {
            Outcome::Return(value, fds) => {
                let line = Message::Return {
                    value,
                    id: id.clone(),
                }
                .to_line();
                if line.len() >= LARGE_REPLY && self.over_reply_budget(line.len()) {
                    return self.answer(token, id, over_budget());
                }
                (line, fds)
            }
            Outcome::ReturnRaw(value) => {
                let line = Message::raw_return_line(&value, id.as_ref());
                if line.len() >= LARGE_REPLY && self.over_reply_budget(line.len()) {
                    return self.answer(token, id, over_budget());
                }
                (line, Vec::new())
            }
            Outcome::Error(class, desc) => (Message::error(class, desc, id).to_line(), Vec::new()),
            Outcome::Wait(_)
            | Outcome::Subscribe { .. }
            | Outcome::Unsubscribe
            | Outcome::Negotiated => return,
        };
        if let Some(client) = self.clients.get_mut(&token) {
            client.queue(line, fds);
        }
    }

    /// Answers the waits that are over (only client `only`'s, if given).
    fn finish_waits(&mut self, only: Option<u32>) {
        let mut i = 0;
        while i < self.waits.len() {
            let (token, _, wait) = &mut self.waits[i];
            let token = *token;
            if only.is_some_and(|t| t != token) {
                i += 1;
                continue;
            }
            let progress = self.handler.check_wait(wait);
            if let Some(c) = self.clients.get_mut(&token) {
                for e in &progress.events {
                    c.queue_event(Message::Event(e.clone()).to_line());
                }
            }
            match progress.done {
                Some(outcome) => {
                    let (token, id, _) = self.waits.swap_remove(i);
                    self.answer(token, id, outcome);
                    if let Some(c) = self.clients.get_mut(&token) {
                        c.busy = false;
                    }
                }
                None => i += 1,
            }
        }
    }

    /// Sends what the client can take, then drops it if it is over its
    /// limits or finished, or updates what to watch it for.
    fn settle(&mut self, token: u32, ops: &mut EventOps) {
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        if let Err(e) = client.flush() {
            return self.hang_up(token, ops, &format!("sending failed: {e}"));
        }
        let more = client.take_ready_held();
        if client.over_limit() {
            return self.drop_client(
                token,
                ops,
                "it does not read its replies (output limit reached)",
            );
        }
        if client.ended && !client.busy && !client.has_output() && !more {
            return self.drop_client(token, ops, "it closed its end");
        }
        let mut set = EventSet::empty();
        if client.wants_input() {
            set |= EventSet::IN;
        }
        if client.has_output() {
            set |= EventSet::OUT;
        }
        if ops
            .modify(Events::with_data(client.stream(), token, set))
            .is_err()
        {
            return self.drop_client(token, ops, "epoll refused it");
        }
        if more {
            self.schedule(token);
        }
    }

    fn drop_client(&mut self, token: u32, ops: &mut EventOps, why: &str) {
        if let Some(client) = self.clients.remove(&token) {
            let _ = ops.remove(Events::empty(client.stream()));
            log::debug!("control: dropping client {token}: {why}");
        }
        self.waits.retain(|(t, _, _)| *t != token);
        self.subscribers.remove(&token);
        self.leftover.remove(&token);
    }

    /// Closes a client with an error line saying why (best effort).
    pub(super) fn close_with(&mut self, token: u32, ops: &mut EventOps, desc: &str) {
        if let Some(c) = self.clients.get_mut(&token) {
            // A reply cut mid-line ends the connection without another byte:
            // the error line goes only at a line boundary.
            let at_boundary = !c.mid_line();
            c.discard_output();
            if at_boundary {
                c.queue(error_line(desc), Vec::new());
                let _ = c.flush();
            }
        }
        self.drop_client(token, ops, desc);
    }

    /// The sampler ticked: send each subscriber the points it has not had.
    fn on_ticks(&mut self, ops: &mut EventOps) {
        let _ = self.ticks.read();
        let Some(samples) = self.handler.samples() else {
            return;
        };
        let tokens: Vec<u32> = self.subscribers.keys().copied().collect();
        for token in tokens {
            let since = self.subscribers.get(&token).copied().unwrap_or(0);
            let (lines, last) = events::samples_after(&samples, since);
            self.subscribers.insert(token, last);
            if let Some(c) = self.clients.get_mut(&token) {
                for l in lines {
                    c.queue_event(l);
                }
            }
            self.settle(token, ops);
        }
    }

    /// Wait results arrived: answer the waits that are over, and pump the
    /// clients they held.
    fn on_watcher(&mut self, ops: &mut EventOps) {
        let _ = self.watcher.read();
        for token in self.queue_events() {
            self.settle(token, ops);
        }
        self.answer_waits(ops);
    }

    /// Queues the events that came since the last call to every negotiated
    /// client (as in QEMU, none before negotiation); every client, when
    /// there were some, to settle (none else).
    fn queue_events(&mut self) -> Vec<u32> {
        let lines = self.handler.broadcast_events();
        if lines.is_empty() {
            return Vec::new();
        }
        for c in self.clients.values_mut().filter(|c| c.negotiated) {
            lines.iter().for_each(|l| c.queue_event(l.clone()));
        }
        self.clients.keys().copied().collect()
    }

    /// `quit` was answered: every negotiated client gets the `SHUTDOWN`
    /// QEMU sends for it (`host-qmp-quit`) before the reply, as QEMU sends
    /// it, and the farewell says it no more.
    fn say_shutdown(&mut self) {
        let line = Message::Event(Event::of(&EventKind::Shutdown(ShutdownInfo::of(
            ShutdownCause::HostQmpQuit,
        ))))
        .to_line();
        for other in self.queue_events() {
            self.schedule(other);
        }
        let tokens: Vec<u32> = self.clients.keys().copied().collect();
        for token in tokens {
            if let Some(c) = self.clients.get_mut(&token).filter(|c| c.negotiated) {
                c.queue_event(line.clone());
                self.schedule(token);
            }
        }
        self.said_shutdown = true;
    }

    /// Answers the waits that are over, and pumps the clients they held.
    fn answer_waits(&mut self, ops: &mut EventOps) {
        let before: Vec<u32> = self.waits.iter().map(|(t, _, _)| *t).collect();
        self.finish_waits(None);
        for token in before {
            if self.clients.get(&token).is_some_and(|c| !c.busy) {
                self.pump(token, ops);
            }
        }
    }

    /// The client limits.
    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Clients with requests left over get their next turn.
    fn on_work(&mut self, ops: &mut EventOps) {
        let _ = self.work.read();
        for token in std::mem::take(&mut self.leftover) {
            self.pump(token, ops);
        }
    }

    /// The server is going: send what can be sent now (a `quit` reply),
    /// and to every negotiated client the `SHUTDOWN` event QEMU sends, with
    /// its cause (a client such as libvirt reads the connection closing
    /// without one as a crash).
    fn farewell(&mut self) {
        let _ = self.exit.read();
        self.done = true;
        let cause = (!self.said_shutdown)
            .then(|| *crate::lock(&self.cause))
            .flatten();
        let line = cause.map(|reason| {
            let info = ShutdownInfo::of(reason);
            Message::Event(Event::of(&EventKind::Shutdown(info))).to_line()
        });
        for client in self.clients.values_mut() {
            if let (Some(line), true) = (&line, client.negotiated) {
                client.queue_event(line.clone());
            }
            let _ = client.flush();
        }
    }
}

impl MutEventSubscriber for Plane {
    fn init(&mut self, ops: &mut EventOps) {
        let period = self.limits.sweep_period();
        if let Err(e) = self.sweep.reset(period, Some(period)) {
            log::error!("control: arming the deadline timer failed: {e}");
        }
        let fds: [(&dyn std::os::fd::AsRawFd, u32); 7] = [
            (&self.listener, LISTENER),
            (&self.exit, EXIT),
            (&*self.watcher, WATCHER),
            (&self.retry, RETRY),
            (&*self.ticks, TICKS),
            (&self.sweep, SWEEP),
            (&self.work, WORK),
        ];
        for (fd, token) in fds {
            if let Err(e) = ops.add(Events::with_data_raw(fd.as_raw_fd(), token, EventSet::IN)) {
                log::error!("control: registering fd {token} with epoll failed: {e}");
                self.done = true;
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            LISTENER => self.accept(ops),
            EXIT => self.farewell(),
            WATCHER => self.on_watcher(ops),
            TICKS => self.on_ticks(ops),
            SWEEP => {
                let _ = self.sweep.wait();
                self.enforce_deadlines(ops);
                self.handler.on_sweep();
                // A wait whose end no thread announces (a queued
                // measurement's deadline) is looked at here too.
                self.answer_waits(ops);
            }
            WORK => self.on_work(ops),
            RETRY => {
                let _ = self.retry.wait();
                let _ = ops.modify(Events::with_data(&self.listener, LISTENER, EventSet::IN));
            }
            token => self.serve(token, events.event_set(), ops),
        }
    }
}

/// What a client in a reserved slot may ask: enough to see the VM's state
/// and stop it.
fn for_the_reserve(command: &Command) -> bool {
    matches!(
        command,
        Command::QmpCapabilities(_)
            | Command::QueryStatus(_)
            | Command::QueryVersion(_)
            | Command::Quit(_)
    )
}

/// Whether a request that did not parse still names a command, other than
/// `qmp_capabilities` (a JSON object whose `execute` is such a string).
fn names_another_command(bytes: &[u8]) -> bool {
    // Read as a request is: a key named twice is no command at all.
    crate::protocol::request::strict_value(bytes)
        .ok()
        .and_then(|v| v.get("execute").and_then(Value::as_str).map(str::to_owned))
        .is_some_and(|name| name != "qmp_capabilities")
}

/// QEMU's answer to any command but `qmp_capabilities` before negotiation.
fn not_negotiated() -> Outcome {
    Outcome::Error(
        ErrorClass::CommandNotFound,
        "Expecting capabilities negotiation with 'qmp_capabilities'".into(),
    )
}

/// The reply to a large query while the clients' queued output is over its budget.
fn over_budget() -> Outcome {
    Outcome::Error(
        ErrorClass::GenericError,
        format!(
            "replies waiting for clients to read them fill the server's budget ({} MiB); try again once they are read",
            MAX_TOTAL_QUEUED >> 20
        ),
    )
}
