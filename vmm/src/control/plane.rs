//! The `control` thread's event-manager subscriber: the listening socket, every
//! client connection, the exit eventfd, the vCPUs' result watcher and a retry
//! timer, each registered with its own token in the event's data.
//!
//! One subscriber holds all of them because accepting a client means adding
//! its fd, which a subscriber can do only for itself (`EventOps::add`).

use std::collections::HashMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use serde_json::{json, Value};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::commands::{Handler, Outcome};
use super::connection::{Connection, Input, Line};
use super::deferred::Pending;
use super::events;
use super::request::{self, ErrorClass};
use super::{scm, MAX_CLIENTS};

const LISTENER: u32 = 0;
const EXIT: u32 = 1;
const WATCHER: u32 = 2;
const RETRY: u32 = 3;
const TICKS: u32 = 4;
const FIRST_CLIENT: u32 = 5;

/// Clients accepted per readiness event of the listener, so a flood of
/// connections cannot starve the clients already there.
const ACCEPTS_PER_EVENT: usize = 32;

/// How long accepting pauses when the process is out of fds.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A reply line: `{"return": value, "id": id}` or `{"error": {...}, "id": id}`.
pub fn reply_line(id: Option<&Value>, body: (&str, Value)) -> Vec<u8> {
    let mut obj = serde_json::Map::new();
    obj.insert(body.0.into(), body.1);
    if let Some(id) = id {
        obj.insert("id".into(), id.clone());
    }
    let mut line = Value::Object(obj).to_string().into_bytes();
    line.push(b'\n');
    line
}

/// The body of an error reply.
pub fn error_body(class: ErrorClass, desc: &str) -> (&'static str, Value) {
    ("error", json!({"class": class.as_str(), "desc": desc}))
}

/// The subscriber.
pub struct Plane {
    listener: UnixListener,
    exit: EventFd,
    watcher: Arc<EventFd>,
    /// Written by the sampler after each tick (never, when it is off).
    ticks: Arc<EventFd>,
    retry: TimerFd,
    handler: Handler,
    clients: HashMap<u32, Connection>,
    /// Deferred replies: client, request id, what they wait for.
    waits: Vec<(u32, Option<Value>, Pending)>,
    /// `subscribe-samples` clients and the last point each was sent.
    subscribers: HashMap<u32, u64>,
    next_token: u32,
    uid: u32,
    /// The exit eventfd fired: the thread ends after this round of events.
    pub done: bool,
}

impl Plane {
    /// The subscriber, from the bound listener, the exit eventfd, the vCPUs'
    /// result watcher and the sampler's tick eventfd, the accept-retry timer,
    /// and the command handler.
    pub fn new(
        listener: UnixListener,
        exit: EventFd,
        [watcher, ticks]: [Arc<EventFd>; 2],
        retry: TimerFd,
        handler: Handler,
    ) -> Plane {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        Plane {
            listener,
            exit,
            watcher,
            ticks,
            retry,
            handler,
            clients: HashMap::new(),
            waits: Vec::new(),
            subscribers: HashMap::new(),
            next_token: FIRST_CLIENT,
            uid,
            done: false,
        }
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

    /// Greets an accepted client, or tells it why not and closes.
    fn admit(&mut self, stream: UnixStream, ops: &mut EventOps) {
        let refusal = match scm::peer_uid(&stream) {
            Ok(uid) if uid == self.uid || uid == 0 => None,
            Ok(uid) => Some((
                ErrorClass::PermissionDenied,
                format!(
                    "uid {uid} may not use this socket: only uid {} and root may",
                    self.uid
                ),
            )),
            Err(e) => Some((
                ErrorClass::PermissionDenied,
                format!("the peer's credentials are unreadable: {e}"),
            )),
        };
        let refusal = refusal.or_else(|| {
            (self.clients.len() >= MAX_CLIENTS).then(|| {
                (
                    ErrorClass::TooManyClients,
                    format!(
                        "this VMM serves at most {MAX_CLIENTS} clients at once; try again later"
                    ),
                )
            })
        });
        if let Some((class, desc)) = refusal {
            log::info!("control: refusing a client: {desc}");
            // Best effort: a new socket's buffer is empty, so this short line fits.
            let _ = scm::send_with_fds(&stream, &reply_line(None, error_body(class, &desc)), &[]);
            return;
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let token = self.next_token;
        self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_CLIENT);
        let mut client = Connection::new(stream);
        let mut greeting = self.handler.greeting().to_string().into_bytes();
        greeting.push(b'\n');
        client.queue(greeting, Vec::new());
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

    /// Runs the client's complete lines, then settles it.
    fn pump(&mut self, token: u32, ops: &mut EventOps) {
        match self.run_lines(token) {
            Ok(()) => self.settle(token, ops),
            Err(why) => self.drop_client(token, ops, why),
        }
    }

    /// The peer is gone (or its socket failed): what it sent is still run (a
    /// piped `quit`, say; it is all in the socket buffer, so reading ends),
    /// and it is dropped.
    fn hang_up(&mut self, token: u32, ops: &mut EventOps, why: &str) {
        if let Some(client) = self.clients.get_mut(&token) {
            // Stops at the end, or at ECONNRESET if our output went unread.
            while let Ok(Input::Data) = client.read() {}
            // Either way no more will come: a partial last line is complete.
            client.ended = true;
        }
        let _ = self.run_lines(token);
        self.drop_client(token, ops, why);
    }

    /// Runs the client's complete lines, until a deferred reply holds them or
    /// its output is over the limit. `Err` when it must be dropped.
    fn run_lines(&mut self, token: u32) -> Result<(), &'static str> {
        while let Some(line) = self.clients.get_mut(&token).and_then(Connection::next_line) {
            let Line::Complete(line) = line else {
                let desc = format!(
                    "a request line may be at most {} bytes; closing",
                    super::MAX_LINE
                );
                if let Some(c) = self.clients.get_mut(&token) {
                    let error = reply_line(None, error_body(ErrorClass::LineTooLong, &desc));
                    c.queue(error, Vec::new());
                    let _ = c.flush();
                }
                return Err("its line was too long");
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.run_line(token, &line);
            if self.clients.get(&token).is_some_and(Connection::over_limit) {
                break; // settle drops it; run no more of its lines
            }
        }
        Ok(())
    }

    fn run_line(&mut self, token: u32, line: &[u8]) {
        let (id, outcome) = match request::parse(line) {
            Ok(req) => (req.id, self.handler.execute(req.command)),
            Err(e) => (e.id, Outcome::Error(e.class, e.desc)),
        };
        let outcome = match outcome {
            Outcome::Subscribe { since, reply } => {
                self.subscribers.insert(token, since);
                Outcome::Return(reply, Vec::new())
            }
            Outcome::Unsubscribe => {
                let was = self.subscribers.remove(&token).is_some();
                Outcome::Return(serde_json::json!({"was-subscribed": was}), Vec::new())
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
        self.answer(token, id.as_ref(), outcome);
    }

    fn answer(&mut self, token: u32, id: Option<&Value>, outcome: Outcome) {
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        match outcome {
            Outcome::Return(value, fds) => client.queue(reply_line(id, ("return", value)), fds),
            Outcome::Error(class, desc) => {
                client.queue(reply_line(id, error_body(class, &desc)), Vec::new())
            }
            Outcome::Wait(_) | Outcome::Subscribe { .. } | Outcome::Unsubscribe => {}
        }
    }

    /// Answers the waits that are over (only client `only`'s, if given).
    fn finish_waits(&mut self, only: Option<u32>) {
        let mut i = 0;
        while i < self.waits.len() {
            let (token, _, wait) = &self.waits[i];
            let token = *token;
            if only.is_some_and(|t| t != token) {
                i += 1;
                continue;
            }
            let progress = self.handler.check_wait(wait);
            if let Some(c) = self.clients.get_mut(&token) {
                for e in &progress.events {
                    c.queue(events::line(e), Vec::new());
                }
            }
            match progress.done {
                Some(outcome) => {
                    let (token, id, _) = self.waits.swap_remove(i);
                    self.answer(token, id.as_ref(), outcome);
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
        if client.over_limit() {
            return self.drop_client(
                token,
                ops,
                "it does not read its replies (output limit reached)",
            );
        }
        if client.ended && !client.busy && !client.has_output() {
            return self.drop_client(token, ops, "it closed its end");
        }
        let mut set = EventSet::empty();
        if !client.busy && !client.ended {
            set |= EventSet::IN;
        }
        if client.has_output() {
            set |= EventSet::OUT;
        }
        if ops
            .modify(Events::with_data(client.stream(), token, set))
            .is_err()
        {
            self.drop_client(token, ops, "epoll refused it");
        }
    }

    fn drop_client(&mut self, token: u32, ops: &mut EventOps, why: &str) {
        if let Some(client) = self.clients.remove(&token) {
            let _ = ops.remove(Events::empty(client.stream()));
            log::debug!("control: dropping client {token}: {why}");
        }
        self.waits.retain(|(t, _, _)| *t != token);
        self.subscribers.remove(&token);
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
                    c.queue(l, Vec::new());
                }
            }
            self.settle(token, ops);
        }
    }

    /// Wait results arrived: answer the waits that are over, and pump the
    /// clients they held.
    fn on_watcher(&mut self, ops: &mut EventOps) {
        let _ = self.watcher.read();
        let lines = self.handler.migration_events();
        if !lines.is_empty() {
            let tokens: Vec<u32> = self.clients.keys().copied().collect();
            for token in tokens {
                if let Some(c) = self.clients.get_mut(&token) {
                    lines.iter().for_each(|l| c.queue(l.clone(), Vec::new()));
                }
                self.settle(token, ops);
            }
        }
        let before: Vec<u32> = self.waits.iter().map(|(t, _, _)| *t).collect();
        self.finish_waits(None);
        for token in before {
            if self.clients.get(&token).is_some_and(|c| !c.busy) {
                self.pump(token, ops);
            }
        }
    }

    /// The server is going: send what can be sent now (a `quit` reply).
    fn farewell(&mut self) {
        let _ = self.exit.read();
        self.done = true;
        for client in self.clients.values_mut() {
            let _ = client.flush();
        }
    }
}

impl MutEventSubscriber for Plane {
    fn init(&mut self, ops: &mut EventOps) {
        let fds: [(&dyn std::os::fd::AsRawFd, u32); 5] = [
            (&self.listener, LISTENER),
            (&self.exit, EXIT),
            (&*self.watcher, WATCHER),
            (&self.retry, RETRY),
            (&*self.ticks, TICKS),
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
            RETRY => {
                let _ = self.retry.wait();
                let _ = ops.modify(Events::with_data(&self.listener, LISTENER, EventSet::IN));
            }
            token => self.serve(token, events.event_set(), ops),
        }
    }
}
