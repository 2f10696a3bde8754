//! Helpers for the migration tests: a destination VMM run in this process
//! (`run::run_incoming` on a thread), migrating a served VM to it, and
//! driving guests through their sockets.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use kvmscope::client::Client;
use kvmscope::migration::receiver::IncomingConfig;
use kvmscope::migration::{MigrationInfo, Status};
use kvmscope::run::{self, RunConfig};
use kvmscope::summary::Summary;
use serde_json::{json, Value};

use super::{socket_path, wait_for, ServedVm};

/// Serialises the migration tests of one binary: each runs two VMMs whose
/// vCPUs spin, and a guest paced by its TSC falls behind when more vCPUs
/// than cores run at once.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A destination VMM (`run --incoming`) on a thread of this process.
pub struct Dest {
    pub socket: PathBuf,
    pub uri: String,
    thread: Option<JoinHandle<Result<Summary, run::Error>>>,
}

impl Dest {
    /// Starts a destination; `given` sets what `run --incoming` was told
    /// (memory, vCPUs...). Returns once it listens.
    pub fn start(test: &str, adjust: impl FnOnce(&mut IncomingConfig, &mut RunConfig)) -> Dest {
        let socket = socket_path(test);
        let listen = socket.with_file_name("incoming.sock");
        Self::start_at(socket, format!("unix:{}", listen.display()), adjust)
    }

    /// Starts a destination listening on TCP at 127.0.0.1 (a free port).
    pub fn start_tcp(test: &str) -> Dest {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        Self::start_at(
            socket_path(test),
            format!("tcp:127.0.0.1:{port}"),
            |_, _| {},
        )
    }

    fn start_at(
        socket: PathBuf,
        uri: String,
        adjust: impl FnOnce(&mut IncomingConfig, &mut RunConfig),
    ) -> Dest {
        let mut incoming = IncomingConfig {
            uri: uri.parse().expect("a unix URI"),
            memory: None,
            vcpus: None,
            hugepages: None,
            dirty_log: None,
            idle_timeout: kvmscope::migration::receiver::DEFAULT_IDLE_TIMEOUT,
        };
        let mut config = RunConfig {
            workloads: Vec::new(),
            socket: Some(socket.clone()),
            fault_cost: Some(super::DEFAULT_FAULT_COST),
            ..RunConfig::demo()
        };
        adjust(&mut incoming, &mut config);
        let thread = std::thread::spawn(move || run::run_incoming(config, incoming));
        let listening = listening_check(&uri);
        wait_for("the destination to listen", Duration::from_secs(20), || {
            listening().then_some(())
        });
        Dest {
            socket,
            uri,
            thread: Some(thread),
        }
    }

    /// A client of the destination's control socket (up once the stream's config arrived).
    pub fn client(&self) -> Client {
        let c = Client::connect_when_ready(&self.socket, Duration::from_secs(30), || Ok(()))
            .expect("the destination's control socket");
        c.set_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        c
    }

    /// Waits for the destination's run to end: its summary, or its error chain.
    pub fn join(mut self) -> Result<Summary, String> {
        let t = self.thread.take().expect("joined once");
        t.join()
            .expect("the destination thread panicked")
            .map_err(|e| kvmscope::error_chain(&e))
    }

    /// Quits the destination and returns its summary.
    pub fn quit(self) -> Summary {
        let mut c = self.client();
        c.execute("quit", json!({})).expect("quit");
        self.join().expect("the destination's run")
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            if let Ok(mut c) = Client::connect(&self.socket) {
                let _ = c.execute("quit", json!({}));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Whether the destination listens at `uri`, without connecting (the one
/// connection it takes is the source's): the socket file, or a TCP port in
/// LISTEN state in /proc/net/tcp.
fn listening_check(uri: &str) -> impl Fn() -> bool {
    let uri = uri.to_string();
    move || match uri.split_once(':') {
        Some(("unix", path)) => super::unix_listening(std::path::Path::new(path)),
        Some(("tcp", addr)) => {
            let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
            let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
            port.is_some_and(|p| {
                let local = format!(":{p:04X}");
                table.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 3 && f[1].ends_with(&local) && f[3] == "0A"
                })
            })
        }
        _ => false,
    }
}

/// `query-migrate` of a VMM.
pub fn query(c: &mut Client) -> MigrationInfo {
    let (v, _) = c
        .execute("query-migrate", json!({}))
        .expect("query-migrate");
    serde_json::from_value(v).expect("a MigrationInfo")
}

/// A destination's `query-migrate` once its migration has ended: it sends
/// the source its COMPLETED reply and then counts itself completed, so
/// asked just as the source completes it may still say `device`.
pub fn arrived(c: &mut Client) -> MigrationInfo {
    wait_for(
        "the destination's migration to end",
        Duration::from_secs(10),
        || Some(query(c)).filter(|i| matches!(i.status, Some(Status::Completed | Status::Failed))),
    )
}

/// Sets `params`, starts `migrate` to `uri` and waits for the end; returns the final status.
pub fn migrate(src: &ServedVm, uri: &str, params: Value) -> MigrationInfo {
    let mut c = src.client();
    start_migration(&mut c, uri, params);
    wait_final(&mut c)
}

/// Sets `params` and starts `migrate` to `uri`, without waiting.
pub fn start_migration(c: &mut Client, uri: &str, params: Value) {
    c.execute("migrate-set-parameters", params)
        .expect("migrate-set-parameters");
    c.execute("migrate", json!({ "uri": uri }))
        .expect("migrate");
}

/// Asserts that a migration completed, showing its error if it did not.
pub fn assert_completed(info: &MigrationInfo) {
    assert_eq!(
        info.status,
        Some(Status::Completed),
        "{:?}",
        info.error_desc
    );
}

/// Waits until a migration is over.
pub fn wait_final(c: &mut Client) -> MigrationInfo {
    wait_for("the migration to end", Duration::from_secs(60), || {
        let info = query(c);
        info.status.is_some_and(Status::is_final).then_some(info)
    })
}

/// Runs `command` on `vcpu` and waits for its results.
pub fn guest(c: &mut Client, vcpu: usize, command: &str) -> Vec<Value> {
    let (v, _) = c
        .execute(
            "guest-command",
            json!({"vcpu": vcpu, "command": command, "wait": true}),
        )
        .expect("guest-command");
    v["results"].as_array().cloned().expect("results")
}

/// Queues `command` on `vcpu` without waiting.
pub fn queue(c: &mut Client, vcpu: usize, command: &str) {
    c.execute("guest-command", json!({"vcpu": vcpu, "command": command}))
        .expect("guest-command");
}

/// Result word `i` of a result.
pub fn value(result: &Value, i: usize) -> u64 {
    assert_eq!(result["status"], "ok", "{result}");
    result["values"][i].as_u64().expect("a result value")
}

/// `kvmscope migrate --predict --converge auto` of `src` to `uri` over
/// 20 MB/s with a 300 ms downtime limit: its report, having checked that it
/// completed.
pub fn converge_auto(src: &ServedVm, uri: &str) -> String {
    use kvmscope::client::migrate::{Converge, MigrateConfig};
    let config = MigrateConfig {
        socket: src.socket.clone(),
        to: uri.to_string(),
        bandwidth: Some(20_000_000),
        max_downtime: Some(Duration::from_millis(300)),
        max_rounds: None,
        predict: true,
        converge: Some(Converge::Auto),
        json: false,
        stop: None,
    };
    let mut out = Vec::new();
    let done = kvmscope::client::migrate::migrate(&config, &mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert!(done, "{text}");
    text
}
