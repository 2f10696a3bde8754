//! Live migration when things go wrong, on real KVM: the destination dies in
//! pass 0, in a later pass, or after the source stopped its vCPUs; the user
//! cancels; the stream is truncated, has a flipped byte or another version.
//! Each time the source's guest runs on intact, and a destination refuses a
//! bad stream with an error naming what was wrong.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use common::migration::{guest, migrate, query, queue, value, wait_final, Dest};
use common::{wait_for, ServedVm};
use kvmscope::migration::format::{self, Kind, Reader};
use kvmscope::migration::Status;
use serde_json::json;

const MEM: u64 = 64 << 20;

/// Copies what it reads; once `slow`, reads 64 KiB a half second at most.
struct Tee {
    inner: UnixStream,
    copy: Vec<u8>,
    slow: bool,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut end = buf.len();
        if self.slow {
            std::thread::sleep(Duration::from_millis(500));
            end = end.min(64 << 10);
        }
        let n = self.inner.read(&mut buf[..end])?;
        self.copy.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// What a fake destination does.
#[derive(Clone, Copy, PartialEq)]
enum Plan {
    /// Hang up when a RAM section of this pass starts.
    DieInPass(u64),
    /// Hang up when the first vCPU section starts (the source's vCPUs are stopped).
    DieAtDeviceState,
    /// Stop reading when the first vCPU section starts, the connection left
    /// open for 8 s (the rest of the stream, a few KiB, fits in the socket).
    StallAtDeviceState,
    /// Take the whole stream, answer `completed`, and return its bytes.
    Record,
    /// Take the whole stream, never answer, and hang up once the source does.
    SilentAtEnd,
    /// Take the whole stream and hang up at once, answering nothing.
    ClosedAtEnd,
    /// Take the whole stream, answer COMPLETED with its message cut short,
    /// and hang up.
    CompletedCut,
    /// Answer COMPLETED right after READY, then read on to the end.
    CompletedEarly,
    /// Take the whole stream, then send COMPLETED a byte every 2 s.
    CompletedTrickled,
    /// After this many passes (the source stopped: `x-max-rounds`), read
    /// 64 KiB a half second, never silent for long.
    SlowAfterPass(u64),
}

/// A destination that follows the protocol until its plan says otherwise.
fn fake_destination(test: &str, plan: Plan) -> (String, JoinHandle<Vec<u8>>) {
    let path: PathBuf = common::socket_path(test).with_file_name("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let uri = format!("unix:{}", path.display());
    let thread = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        let mut out = s.try_clone().unwrap();
        let mut r = Reader::start(Tee {
            inner: s,
            copy: Vec::new(),
            slow: false,
        })
        .unwrap();
        let mut passes = 0;
        let mut buf = Vec::new();
        while let Ok((kind, len)) = r.section() {
            let dies = match plan {
                Plan::DieInPass(p) => kind == Kind::Ram && passes == p,
                Plan::DieAtDeviceState => kind == Kind::Vcpu,
                _ => false,
            };
            if dies {
                return Vec::new();
            }
            if kind == Kind::Vcpu && plan == Plan::StallAtDeviceState {
                std::thread::sleep(Duration::from_secs(8));
                return Vec::new();
            }
            if kind == Kind::End && plan == Plan::ClosedAtEnd {
                r.finish(len).unwrap();
                return Vec::new();
            }
            if kind == Kind::End && plan == Plan::SilentAtEnd {
                r.finish(len).unwrap();
                let _ = r.inner().inner.read_to_end(&mut Vec::new());
                return Vec::new();
            }
            if kind == Kind::End && plan == Plan::CompletedCut {
                r.finish(len).unwrap();
                // A reply of code COMPLETED whose 100-byte message stops at 10.
                let mut reply = b"KSMR".to_vec();
                reply.extend_from_slice(&format::REPLY_COMPLETED.to_le_bytes());
                reply.extend_from_slice(&100u32.to_le_bytes());
                reply.extend_from_slice(&[0; 4]);
                reply.extend_from_slice(&[b'x'; 10]);
                out.write_all(&reply).unwrap();
                return Vec::new();
            }
            if kind == Kind::End && plan == Plan::CompletedTrickled {
                r.finish(len).unwrap();
                let mut reply = Vec::new();
                format::write_reply(&mut reply, format::REPLY_COMPLETED, "").unwrap();
                for byte in reply.chunks(1) {
                    if out.write_all(byte).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(2));
                }
                return Vec::new();
            }
            if kind == Kind::End {
                r.finish(len).unwrap();
                // A source that gave up meanwhile has shut the connection:
                // the answer then fails, as a real destination's would.
                let _ = format::write_reply(&mut out, format::REPLY_COMPLETED, "");
                break;
            }
            buf.resize(len as usize, 0);
            if r.read_exact(&mut buf, "a section").is_err() && plan == Plan::CompletedEarly {
                return Vec::new();
            }
            match kind {
                Kind::Config => {
                    format::write_reply(&mut out, format::REPLY_READY, "").unwrap();
                    if plan == Plan::CompletedEarly {
                        format::write_reply(&mut out, format::REPLY_COMPLETED, "").unwrap();
                    }
                }
                Kind::Pass => {
                    passes += 1;
                    r.inner().slow |= plan == Plan::SlowAfterPass(passes);
                }
                _ => {}
            }
        }
        std::mem::take(&mut r.inner().copy)
    });
    (uri, thread)
}

/// The source failed, and its guest runs on with its memory intact.
fn assert_source_runs_on(src: &ServedVm, info: &kvmscope::migration::MigrationInfo) {
    assert_eq!(info.status, Some(Status::Failed), "{info:?}");
    assert!(info.error_desc.is_some());
    let mut c = src.client();
    let r = guest(&mut c, 0, "verify size=1M; touch offset=2M size=4K");
    assert_eq!(value(&r[0], 2), 0, "the guest's memory is intact");
    assert_eq!(value(&r[1], 0), 1, "and it runs");
}

/// The failure is said as what happened: a destination that closed the
/// connection ("Broken pipe (os error 32)" named no one).
fn assert_closed(info: &kvmscope::migration::MigrationInfo) {
    let why = info.error_desc.as_deref().unwrap_or_default();
    assert!(
        why.contains("the destination closed the connection"),
        "{why}"
    );
}

/// A source whose vCPU 1 rewrites 4 MiB as fast as it can, running before
/// this returns: every pass finds pages dirtied, so a migration with a
/// downtime limit of 0 never stops by itself (a paced writer could leave a
/// short pass clean, and the migration completed before the pass where the
/// destination was to die).
fn busy_source(test: &str) -> ServedVm {
    let src = ServedVm::start(test, MEM, 2);
    let mut c = src.client();
    guest(&mut c, 0, "touch size=1M");
    queue(&mut c, 1, "dirty offset=8M ws=4M rate=max for=20s");
    wait_for("vCPU 1 to write", Duration::from_secs(10), || {
        let (v, _) = c.execute("query-guest", json!({"vcpus": [1]})).ok()?;
        (v[0]["progress"].as_u64()? > 0).then_some(())
    });
    src
}

#[test]
fn a_destination_that_dies_in_pass_0_leaves_the_source_running() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-die0");
    let (uri, fake) = fake_destination("mig-die0-dst", Plan::DieInPass(0));
    let info = migrate(&src, &uri, json!({"downtime-limit": 0}));
    fake.join().unwrap();
    assert_closed(&info);
    assert_source_runs_on(&src, &info);
}

#[test]
fn a_destination_that_dies_in_a_later_pass_leaves_the_source_running() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-die2");
    let (uri, fake) = fake_destination("mig-die2-dst", Plan::DieInPass(2));
    let info = migrate(&src, &uri, json!({"downtime-limit": 0}));
    fake.join().unwrap();
    assert!(info.ram.as_ref().unwrap().dirty_sync_count >= 2, "{info:?}");
    assert_closed(&info);
    assert_source_runs_on(&src, &info);
}

#[test]
fn a_destination_that_dies_after_the_vcpus_stopped_leaves_the_source_running() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-die-dev");
    let (uri, fake) = fake_destination("mig-die-dev-dst", Plan::DieAtDeviceState);
    let info = migrate(&src, &uri, json!({"downtime-limit": 300}));
    fake.join().unwrap();
    assert_closed(&info);
    assert_source_runs_on(&src, &info);
}

/// A destination that takes the whole stream and hangs up cleanly, with no
/// answer, is named (it read "the source cancelled the migration, failed
/// or was killed", the destination's own words for a cut stream); it will
/// not run the guest, which runs on here.
#[test]
fn a_destination_that_hangs_up_instead_of_answering_is_named() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-closed-end");
    let (uri, fake) = fake_destination("mig-closed-end-dst", Plan::ClosedAtEnd);
    let info = migrate(&src, &uri, json!({"downtime-limit": 300}));
    fake.join().unwrap();
    assert_closed(&info);
    let why = info.error_desc.as_deref().unwrap_or_default();
    assert!(why.contains("when it was to answer"), "{why}");
    assert_source_runs_on(&src, &info);
}

#[test]
fn a_destination_silent_after_the_trailer_fails_the_migration_naming_it() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-silent");
    let (uri, fake) = fake_destination("mig-silent-dst", Plan::SilentAtEnd);
    let info = migrate(&src, &uri, json!({"downtime-limit": 300}));
    fake.join().unwrap();
    let why = info.error_desc.clone().unwrap_or_default();
    assert!(
        why.contains("the destination did not answer for 5s"),
        "{why}"
    );
    assert_paused_until_cont(&src, &info);
}

/// A destination that stops reading at the stop, the rest of the stream
/// queued in the socket: the source wrote it all, and the destination went
/// silent. The failure says what the peer never took (the socket's queue,
/// once the connection is shut): a kvmscope destination listening there
/// cannot run the guest, but a relay could still pass the rest on, so the
/// guest stays paused for `cont`, as for any silence after the trailer.
#[test]
fn a_destination_that_never_read_the_streams_end_is_said_so_the_guest_paused() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-stall-stop");
    let (uri, fake) = fake_destination("mig-stall-stop-dst", Plan::StallAtDeviceState);
    let info = migrate(&src, &uri, json!({"downtime-limit": 300}));
    let why = info.error_desc.clone().unwrap_or_default();
    assert!(
        why.contains("the destination did not answer for 5s")
            && why.contains("never took its last")
            && why.contains("one behind a relay such as socat or ssh still may"),
        "{why}"
    );
    // As any silence after the trailer: paused until `cont`.
    assert_paused_until_cont(&src, &info);
    fake.join().unwrap();
}

/// A destination that answers COMPLETED a byte at a time, never silent for
/// the 5 s the stop allows, held the paused guest for as long as it
/// trickled (16 bytes: 32 s, and the migration completed). The stop has a
/// deadline for the whole: past it the migration fails, and as the whole
/// stream was sent the guest stays paused until `cont`.
#[test]
fn a_destination_that_trickles_its_answer_is_given_up_on_all_told() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-trickle-done");
    let (uri, fake) = fake_destination("mig-trickle-done-dst", Plan::CompletedTrickled);
    let info = migrate(&src, &uri, json!({"downtime-limit": 300}));
    fake.join().unwrap();
    let why = info.error_desc.clone().unwrap_or_default();
    assert!(
        why.contains("the destination did not answer within") && why.contains("all told"),
        "{why}"
    );
    assert_paused_until_cont(&src, &info);
}

/// A destination that reads the stop's pages slowly (64 KiB a half
/// second: 4 MiB in 32 s), never silent for long, held the paused guest
/// until it had read them all. The stop's whole deadline (its silence bound
/// plus four times what its bytes take at the last pass's rate) ends it.
/// Where the trailer was not sent, the guest runs on here; where it was (a
/// stop small enough to fit in the socket, as the writer's pace leaves
/// it), it stays paused for `cont`, saying what the peer never took.
#[test]
fn a_destination_that_reads_the_stop_slowly_is_given_up_on_all_told() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-slow-stop");
    let (uri, fake) = fake_destination("mig-slow-stop-dst", Plan::SlowAfterPass(2));
    let info = migrate(&src, &uri, json!({"downtime-limit": 0, "x-max-rounds": 2}));
    fake.join().unwrap();
    let why = info.error_desc.clone().unwrap_or_default();
    // Where the stop was small enough to be sent whole, the destination's
    // silence after it may be what ends it first (its bound, 5 s, and the
    // whole deadline, 5 s plus the stop's few bytes' time, come together):
    // said as silence, as the docs' table says.
    let silent_after_all = why.contains("the whole stream was sent")
        && why.contains("the destination did not answer for 5s");
    assert!(
        why.contains("all told") || silent_after_all,
        "{why}: {info:?}"
    );
    if why.contains("the whole stream was sent") {
        assert!(why.contains("never took its last"), "{why}");
        assert_paused_until_cont(&src, &info);
    } else {
        assert!(
            why.contains("the destination did not read the stream within"),
            "{why}"
        );
        assert_source_runs_on(&src, &info);
    }
}

/// A migration that failed after its whole stream was sent: the destination
/// may run the guest, so the source keeps it paused, saying why, until `cont`.
fn assert_paused_until_cont(src: &ServedVm, info: &kvmscope::migration::MigrationInfo) {
    let why = info.error_desc.clone().unwrap_or_default();
    assert!(
        why.contains("the destination may be running the guest"),
        "{why}"
    );
    let mut c = src.client();
    let (status, _) = c.execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "paused", "{status}");
    c.execute("cont", json!({})).unwrap();
    assert_source_runs_on(src, info);
}

/// Once the trailer is sent the destination may run the guest: a cancel
/// that resumed the source then would leave two running. It is not taken.
#[test]
fn a_cancel_after_the_trailer_is_not_taken() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-late-cancel");
    let (uri, fake) = fake_destination("mig-late-cancel-dst", Plan::SilentAtEnd);
    let mut c = src.client();
    common::migration::start_migration(&mut c, &uri, json!({"downtime-limit": 300}));
    wait_for("the stop", Duration::from_secs(30), || {
        (query(&mut c).status == Some(Status::Device)).then_some(())
    });
    // A 1 MiB guest's last pages and state take milliseconds; the source
    // then waits 5 s for the silent destination's answer.
    std::thread::sleep(Duration::from_millis(500));
    c.execute("migrate_cancel", json!({})).unwrap();
    assert_eq!(query(&mut c).status, Some(Status::Device), "not cancelled");
    let info = wait_final(&mut c);
    fake.join().unwrap();
    // It ends as the silence decides (failed, the source paused until
    // `cont`: the destination may run the guest), not as a cancel.
    let why = info.error_desc.clone().unwrap_or_default();
    assert!(why.contains("the destination did not answer"), "{why}");
    assert_paused_until_cont(&src, &info);
}

#[test]
fn a_cancelled_migration_leaves_the_source_running_and_says_cancelled() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-cancel");
    let dest = Dest::start("mig-cancel-dst", |_, _| {});
    let mut c = src.client();
    c.execute(
        "migrate-set-parameters",
        json!({"max-bandwidth": 8_000_000, "downtime-limit": 0}),
    )
    .unwrap();
    c.execute("migrate", json!({"uri": dest.uri})).unwrap();
    wait_for("a pass to end", Duration::from_secs(30), || {
        let info = query(&mut c);
        (info.ram?.dirty_sync_count >= 1).then_some(())
    });
    c.execute("migrate_cancel", json!({})).unwrap();
    let info = wait_final(&mut c);
    assert_eq!(info.status, Some(Status::Cancelled), "{info:?}");
    // As QEMU's: `error-desc` comes with `failed` only.
    assert_eq!(info.error_desc, None, "{info:?}");
    // What pre-copy sent is counted as it went (QEMU's precopy-bytes), not
    // only at a stop that never came.
    let (q, _) = c.execute("query-migrate", json!({})).unwrap();
    let (pre, sent) = (&q["ram"]["precopy-bytes"], &q["ram"]["transferred"]);
    assert!(
        pre.as_u64()
            .is_some_and(|b| b > 0 && Some(b) <= sent.as_u64()),
        "{q}"
    );
    let r = guest(&mut c, 0, "verify size=1M");
    assert_eq!(value(&r[0], 2), 0);
    assert!(
        dest.join().is_err(),
        "the destination refuses the cut stream"
    );
}

/// A source of one vCPU whose guest has written its first MiB.
fn touched_source(test: &str) -> ServedVm {
    let src = ServedVm::start(test, MEM, 1);
    guest(&mut src.client(), 0, "touch size=1M");
    src
}

/// A real stream of a small guest, as a destination received it.
fn recorded_stream(test: &str) -> Vec<u8> {
    recorded_stream_with(test, json!({}))
}

/// The same, with migration parameters `params`.
fn recorded_stream_with(test: &str, params: serde_json::Value) -> Vec<u8> {
    let src = touched_source(test);
    let (uri, fake) = fake_destination(&format!("{test}-rec"), Plan::Record);
    let info = migrate(&src, &uri, params);
    assert_eq!(info.status, Some(Status::Completed), "{info:?}");
    fake.join().unwrap()
}

/// Feeds `bytes` to a real destination; returns its error.
fn replay(test: &str, bytes: &[u8]) -> String {
    let dest = Dest::start(test, |_, _| {});
    let path = dest.uri.trim_start_matches("unix:").to_string();
    let mut s = UnixStream::connect(path).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    dest.join().expect_err("the destination refuses the stream")
}

/// Offset of the first byte of normal page data in a stream.
fn first_page_data(bytes: &[u8]) -> usize {
    let mut at = 16;
    loop {
        let kind = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap()) as usize;
        let body = at + 16;
        if kind == Kind::Ram as u32 {
            let mut run = body;
            // Pass 0 opens with the boot pages: its first normal run comes
            // before any zero run carries on past it.
            while run < body + len {
                let normal = u32::from_le_bytes(bytes[run + 12..run + 16].try_into().unwrap())
                    == format::RunKind::Normal as u32;
                if normal {
                    return run + 16;
                }
                run += 16;
            }
        }
        at = body + len;
    }
}

#[test]
fn truncated_flipped_and_wrong_version_streams_are_refused_with_their_error() {
    require_kvm!();
    let _serial = common::migration::serial();
    let stream = recorded_stream("mig-bad");
    let e = replay("mig-bad-cut", &stream[..stream.len() / 2]);
    assert!(e.contains("truncated"), "{e}");
    let mut flipped = stream.clone();
    flipped[first_page_data(&stream) + 100] ^= 0x40;
    let e = replay("mig-bad-flip", &flipped);
    assert!(e.contains("checksum does not match"), "{e}");
    let mut v2 = stream;
    v2[8] = 2;
    let e = replay("mig-bad-version", &v2);
    assert!(
        e.contains("stream version 2 is not supported: this kvmscope reads version 1"),
        "{e}"
    );
}

#[test]
fn peers_that_are_not_sources_do_not_end_the_destinations_wait() {
    require_kvm!();
    let _serial = common::migration::serial();
    let dest = Dest::start("mig-stray", |_, _| {});
    let path = dest.uri.trim_start_matches("unix:").to_string();
    // An HTTP health check, then an agent that connects, says nothing and
    // leaves (as a control-socket client waiting for a greeting would).
    let mut probe = UnixStream::connect(&path).unwrap();
    probe.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(probe);
    drop(UnixStream::connect(&path).unwrap());
    let src = touched_source("mig-stray-src");
    let info = migrate(&src, &dest.uri, json!({}));
    assert_eq!(info.status, Some(Status::Completed), "{info:?}");
    let done = guest(&mut dest.client(), 0, "verify size=1M");
    assert_eq!(done[0]["values"][2], 0, "no page differs: {done:?}");
    dest.quit();
}

/// `kvmscope migrate --socket SOCKET ARGS`, to run.
fn migrate_command(socket: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_kvmscope"));
    c.args(["migrate", "--socket"]).arg(socket).args(args);
    c
}

/// `kvmscope migrate` with `args` on `src`: its exit code, stdout and stderr.
fn migrate_cli(src: &ServedVm, args: &[&str]) -> (Option<i32>, String, String) {
    let out = migrate_command(&src.socket, args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cli_sets_its_defaults_each_time_not_what_an_earlier_migrate_left() {
    require_kvm!();
    let src = ServedVm::start("mig-cli-defaults", MEM, 1);
    let params = || {
        let (p, _) = src
            .client()
            .execute("query-migrate-parameters", json!({}))
            .unwrap();
        (
            p["max-bandwidth"].clone(),
            p["downtime-limit"].clone(),
            p["x-max-rounds"].clone(),
        )
    };
    let nowhere = "unix:/nonexistent/kvmscope-test";
    let (code, _, _) = migrate_cli(
        &src,
        &[
            "--to",
            nowhere,
            "--bandwidth",
            "100Mbit",
            "--max-downtime",
            "2s",
            "--max-rounds",
            "3",
        ],
    );
    assert_eq!(code, Some(1), "a destination that is not there");
    assert_eq!(params(), (json!(12_500_000), json!(2000), json!(3)));
    // The next migrate with no flags runs with the defaults its --help gives.
    let (code, _, _) = migrate_cli(&src, &["--to", nowhere]);
    assert_eq!(code, Some(1));
    assert_eq!(params(), (json!(0), json!(300), json!(0)));
    // 0bit is unlimited, as for max-bandwidth.
    migrate_cli(&src, &["--to", nowhere, "--bandwidth", "1Gbit"]);
    migrate_cli(&src, &["--to", nowhere, "--bandwidth", "0bit"]);
    assert_eq!(params().0, json!(0));
}

#[test]
fn the_cli_refuses_a_vmm_that_cannot_migrate_before_it_changes_anything() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-cli-busy");
    let dest = Dest::start("mig-cli-busy-dst", |_, _| {});
    let mut c = src.client();
    common::migration::start_migration(
        &mut c,
        &dest.uri,
        json!({"max-bandwidth": 1_000_000, "downtime-limit": 1}),
    );
    let asked = || {
        let (p, _) = src
            .client()
            .execute("query-migrate-parameters", json!({}))
            .unwrap();
        let (caps, _) = src
            .client()
            .execute("query-migrate-capabilities", json!({}))
            .unwrap();
        (
            p["max-bandwidth"].clone(),
            p["downtime-limit"].clone(),
            caps,
        )
    };
    let before = asked();
    // A second client's migrate, flags and all, while one runs: the
    // bandwidth it asks for would have been the running migration's.
    let (code, _, err) = migrate_cli(
        &src,
        &[
            "--to",
            "unix:/nonexistent/kvmscope-test",
            "--bandwidth",
            "1Gbit",
            "--max-downtime",
            "2s",
            "--converge",
            "auto-converge",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("a migration is already") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(asked(), before, "the running migration's parameters");
    c.execute("migrate_cancel", json!({})).unwrap();
    assert_eq!(wait_final(&mut c).status, Some(Status::Cancelled));
    assert!(
        dest.join().is_err(),
        "the destination refuses the cut stream"
    );
}

#[test]
fn a_report_nobody_reads_still_ends_with_the_migrations_status() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = ServedVm::start("mig-cli-epipe", MEM, 1);
    let dest = Dest::start("mig-cli-epipe-dst", |_, _| {});
    // `kvmscope migrate --predict | head -1`: the reader goes before the
    // report's first line.
    let (code, err) = common::output_unread(&mut migrate_command(
        &src.socket,
        &["--to", &dest.uri, "--predict"],
    ));
    assert_eq!(code, Some(0), "completed: {err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    // stderr is no terminal: no bar, a line per status and pass instead.
    assert!(err.contains("kvmscope migrate: completed, pass "), "{err}");
    assert!(!err.contains('\r') && !err.contains("up to date"), "{err}");
    assert_eq!(query(&mut src.client()).status, Some(Status::Completed));
    dest.quit();
}

#[test]
fn a_signal_before_the_migration_starts_ends_the_cli_saying_none_started() {
    require_kvm!();
    let src = ServedVm::start_with("mig-cli-early", MEM, 1, |c| {
        c.vm.dirty_log = Some(kvmscope::dirty::DirtyMode::Bitmap);
    });
    // --predict measures for a second before anything starts.
    let child = migrate_command(
        &src.socket,
        &["--to", "unix:/nonexistent/kvmscope-test", "--predict"],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The client takes SIGINT first thing (it blocks it in its main
    // thread for its signal thread): not before, or it dies of it.
    let status = format!("/proc/{}/status", child.id());
    common::wait_for("the client to take SIGINT", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&status).ok()?;
        let blocked = text.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
        let mask = u64::from_str_radix(blocked.trim(), 16).ok()?;
        (mask & (1 << (libc::SIGINT - 1)) != 0).then_some(())
    });
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // At once, saying so; or, where it came in the microseconds before the
    // client asked for that, taken and answered the same way a moment on.
    match out.status.code() {
        Some(130) => assert!(
            err.contains("kvmscope: signal 2: no migration was started"),
            "{err}"
        ),
        code => {
            assert_eq!(code, Some(1), "{err}");
            assert!(
                err.contains("before the migration began: none started"),
                "{err}"
            );
        }
    }
    assert_eq!(query(&mut src.client()).status, None, "none started");
}

#[test]
fn a_signal_to_the_cli_cancels_its_migration_and_the_source_runs_on() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-cli-sigint");
    let dest = Dest::start("mig-cli-sigint-dst", |_, _| {});
    let mut child = migrate_command(
        &src.socket,
        &[
            "--to",
            &dest.uri,
            "--bandwidth",
            "8Mbit",
            "--max-downtime",
            "1ms",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut c = src.client();
    wait_for("the migration to run", Duration::from_secs(30), || {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("kvmscope migrate ended first ({status}): {err}");
        }
        (query(&mut c).status == Some(Status::Active)).then_some(())
    });
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("signal 2: cancelling the migration"),
        "{stderr}"
    );
    assert!(stdout.contains("Migration status: cancelled"), "{stdout}");
    let info = wait_final(&mut c);
    assert_eq!(info.status, Some(Status::Cancelled), "{info:?}");
    let r = guest(&mut c, 0, "verify size=1M");
    assert_eq!(value(&r[0], 2), 0, "the source's guest runs on intact");
    assert!(
        dest.join().is_err(),
        "the destination refuses the cut stream"
    );
}

/// Relays one client's connection to `target`, and stops passing the
/// server's replies on once `frozen` is set: a VMM that stopped answering
/// (SIGSTOPped, hung), as its client sees it.
fn freezing_relay(
    dir: &std::path::Path,
    target: std::path::PathBuf,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    withheld: std::sync::mpsc::Sender<()>,
) -> std::path::PathBuf {
    let path = dir.join("relay.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let server = UnixStream::connect(&target).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut buf = [0u8; 4096];
        while let Ok(n) = s_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            if frozen.load(std::sync::atomic::Ordering::SeqCst) {
                // A reply the client now waits for in vain.
                let _ = withheld.send(());
                break;
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        // Frozen: hold the client's end open, answering nothing.
        std::thread::sleep(Duration::from_secs(60));
    });
    path
}

/// A VMM that stops answering while the client migrates: the first signal
/// waits on it (the client cannot cancel through it), a second ends the
/// client at once, saying so.
#[test]
fn a_second_signal_ends_the_cli_while_its_vmm_does_not_answer() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = busy_source("mig-cli-frozen");
    let dest = Dest::start("mig-cli-frozen-dst", |_, _| {});
    let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dir = common::test_dir("mig-cli-frozen-relay");
    let (tx, withheld) = std::sync::mpsc::channel();
    let relay = freezing_relay(&dir, src.socket.clone(), frozen.clone(), tx);
    let mut child = migrate_command(&relay, &["--to", &dest.uri, "--bandwidth", "8Mbit"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = src.client();
    wait_for("the migration to run", Duration::from_secs(30), || {
        assert!(
            child.try_wait().unwrap().is_none(),
            "kvmscope migrate ended first"
        );
        (query(&mut c).status == Some(Status::Active)).then_some(())
    });
    frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    // The client polls every 100 ms: its next reply is withheld.
    withheld
        .recv_timeout(Duration::from_secs(20))
        .expect("a reply withheld");
    // SAFETY: sending signals to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_for("the client to end", Duration::from_secs(20), || {
        child.try_wait().unwrap()
    });
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("ends without waiting for the migration's end"),
        "{err}"
    );
    // The migration is the VMM's: it runs on until cancelled.
    assert_eq!(query(&mut c).status, Some(Status::Active));
    c.execute("migrate_cancel", json!({})).unwrap();
    assert_eq!(wait_final(&mut c).status, Some(Status::Cancelled));
    assert!(
        dest.join().is_err(),
        "the destination refuses the cut stream"
    );
}

#[test]
fn a_signal_ends_the_cli_at_once_while_nothing_has_started() {
    // A "VMM" that takes the connection and never greets: the client waits
    // for the greeting, with nothing to cancel yet.
    let dir = common::test_dir("mig-cli-silent");
    let socket = dir.join("silent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let mut child = migrate_command(&socket, &["--to", "unix:/nonexistent/kvmscope-test"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (_held, _) = listener.accept().unwrap();
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_for("the client to end", Duration::from_secs(10), || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status}");
}

/// A stream's sections before its trailer: (kind, payload).
type Sections = Vec<(u32, Vec<u8>)>;

/// The sections of `stream`.
fn sections(stream: &[u8]) -> Sections {
    let mut out = Vec::new();
    let mut at = 16;
    loop {
        let kind = u32::from_le_bytes(stream[at..at + 4].try_into().unwrap());
        let len = u64::from_le_bytes(stream[at + 8..at + 16].try_into().unwrap()) as usize;
        if kind == Kind::End as u32 {
            return out;
        }
        out.push((kind, stream[at + 16..at + 16 + len].to_vec()));
        at += 16 + len;
    }
}

/// A stream of `sections` after `stream`'s header, with a trailer that
/// counts them and sums every byte before it: well formed, whatever the
/// sections say.
fn assemble(stream: &[u8], sections: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = stream[..16].to_vec();
    for (kind, payload) in sections {
        out.extend(section_bytes(*kind, payload));
    }
    let crc = crc32fast::hash(&out);
    let mut trailer = (sections.len() as u64).to_le_bytes().to_vec();
    trailer.extend_from_slice(&crc.to_le_bytes());
    trailer.extend_from_slice(&0u32.to_le_bytes());
    out.extend(section_bytes(Kind::End as u32, &trailer));
    out
}

/// One section on the wire: its header (kind, reserved, length), then `payload`.
fn section_bytes(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = kind.to_le_bytes().to_vec();
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Sections a well-formed stream may carry only where, and as often as,
/// a source sends them, each refused as it comes, naming what was wrong: a
/// vCPU twice, a digest twice, a plan after RAM, a pass numbered below the
/// last, a config field no version defines.
#[test]
fn sections_out_of_place_or_repeated_are_refused_as_they_come() {
    require_kvm!();
    let _serial = common::migration::serial();
    let stream = recorded_stream_with("mig-order", json!({"x-check-ram": true}));
    let real = sections(&stream);
    assert_eq!(
        assemble(&stream, &real),
        stream,
        "the trailer as a source writes it"
    );
    let at = |kind: Kind| real.iter().position(|(k, _)| *k == kind as u32).unwrap();
    let (config, vcpu, digest) = (at(Kind::Config), at(Kind::Vcpu), at(Kind::Digest));
    let with = |f: &dyn Fn(&mut Sections)| {
        let mut s = real.clone();
        f(&mut s);
        assemble(&stream, &s)
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "vcpu",
            with(&|s| s.insert(vcpu, s[vcpu].clone())),
            "carries vCPU 0 twice",
        ),
        (
            "digest",
            with(&|s| s.insert(digest, s[digest].clone())),
            "digest section came out of order",
        ),
        (
            "plan",
            with(&|s| {
                // The source's plan moved after the first RAM.
                let plan = s.iter().position(|(k, _)| *k == Kind::Plan as u32).unwrap();
                let moved = s.remove(plan);
                let ram = s.iter().position(|(k, _)| *k == Kind::Ram as u32).unwrap();
                s.insert(ram + 1, moved);
            }),
            "plan section came out of order",
        ),
        (
            "plan-after-pass",
            with(&|s| {
                // The plan again after pass 0's record.
                let plan = s
                    .iter()
                    .find(|(k, _)| *k == Kind::Plan as u32)
                    .unwrap()
                    .clone();
                let pass = s.iter().position(|(k, _)| *k == Kind::Pass as u32).unwrap();
                s.insert(pass + 1, plan);
            }),
            "plan section came out of order",
        ),
        (
            // The config, the vCPUs and the trailer: no RAM at all (a
            // destination ran its guest on memory that never came).
            "no-ram",
            with(&|s| {
                s.retain(|(k, _)| *k == Kind::Config as u32 || *k == Kind::Vcpu as u32);
            }),
            "a vCPU section came before the stream's pass 0 ended: the guest's RAM never came",
        ),
        (
            "no-ram-digest",
            with(&|s| s.retain(|(k, _)| *k != Kind::Ram as u32 && *k != Kind::Pass as u32)),
            "the RAM digest came before the stream's pass 0 ended",
        ),
        (
            // Config and plan, then the trailer.
            "no-pass",
            with(&|s| s.truncate(config + 1)),
            "the trailer came before the stream's pass 0 ended",
        ),
        (
            // Pass 0 less its last RAM section: pages left out.
            "pass0-short",
            with(&|s| {
                let pass = s.iter().position(|(k, _)| *k == Kind::Pass as u32).unwrap();
                assert_eq!(s[pass - 1].0, Kind::Ram as u32);
                s.remove(pass - 1);
            }),
            "the stream's pass 0 gave",
        ),
        (
            // Pass 0 with its first RAM section again at its end: the
            // pages add up, but they go back.
            "pass0-back",
            with(&|s| {
                let first = s.iter().position(|(k, _)| *k == Kind::Ram as u32).unwrap();
                let pass = s.iter().position(|(k, _)| *k == Kind::Pass as u32).unwrap();
                let again = s[first].clone();
                s.insert(pass, again);
            }),
            "a source sends pass 0's pages in order",
        ),
        (
            "plan-after-vcpu",
            with(&|s| {
                let plan = s
                    .iter()
                    .find(|(k, _)| *k == Kind::Plan as u32)
                    .unwrap()
                    .clone();
                let vcpu = s.iter().position(|(k, _)| *k == Kind::Vcpu as u32).unwrap();
                s.insert(vcpu + 1, plan);
            }),
            "plan section came out of order",
        ),
        (
            "pass",
            with(&|s| {
                let pass = s.iter().position(|(k, _)| *k == Kind::Pass as u32).unwrap();
                let mut zero = s[pass].clone();
                zero.1[..8].copy_from_slice(&0u64.to_le_bytes());
                s.insert(pass + 1, zero);
            }),
            "pass 0 came after pass 0",
        ),
        (
            "mode",
            with(&|s| s[config].1[24..28].copy_from_slice(&7u32.to_le_bytes())),
            "the config's dirty_mode is 7",
        ),
        (
            "huge",
            with(&|s| s[config].1[20..24].copy_from_slice(&5u32.to_le_bytes())),
            "the config's hugepages is 5",
        ),
    ];
    for (name, bytes, says) in cases {
        let e = replay(&format!("mig-order-{name}"), &bytes);
        assert!(e.contains(says), "{name}: {e}");
    }
}

/// A source that goes silent inside the trailer is named by the idle
/// deadline, as anywhere else in the stream (it read as a stream cut short).
#[test]
fn a_source_silent_inside_the_trailer_is_named_by_the_idle_deadline() {
    require_kvm!();
    let _serial = common::migration::serial();
    let stream = recorded_stream("mig-trailer");
    let dest = Dest::start("mig-trailer-dest", |incoming, _| {
        incoming.idle_timeout = Duration::from_secs(1);
    });
    let mut s = UnixStream::connect(dest.uri.trim_start_matches("unix:")).unwrap();
    // All but the trailer's last 8 bytes, the connection left open.
    s.write_all(&stream[..stream.len() - 8]).unwrap();
    let e = dest.join().expect_err("refused");
    assert!(
        e.contains("the source sent nothing for 1s (the idle deadline"),
        "{e}"
    );
    drop(s);
}

/// A source that always has bytes ready (an endless run of valid zero
/// pages) never makes the destination wait on a read: `quit` stops it
/// all the same, naming who stopped it.
#[test]
fn quit_stops_a_destination_whose_source_never_pauses() {
    require_kvm!();
    let _serial = common::migration::serial();
    let stream = recorded_stream("mig-flood");
    let real = sections(&stream);
    let dest = Dest::start("mig-flood-dest", |_, _| {});
    let mut s = UnixStream::connect(dest.uri.trim_start_matches("unix:")).unwrap();
    let mut head = stream[..16].to_vec();
    let (kind, config) = &real[0];
    assert_eq!(*kind, Kind::Config as u32);
    head.extend(section_bytes(*kind, config));
    // Pass 0 whole (every page in one zero run, and its record), so that
    // the flood after it is a later pass's, which may send a page again.
    let pages = MEM / 4096;
    let mut all = 0u64.to_le_bytes().to_vec();
    all.extend_from_slice(&u32::try_from(pages).unwrap().to_le_bytes());
    all.extend_from_slice(&(format::RunKind::Zero as u32).to_le_bytes());
    head.extend(section_bytes(Kind::Ram as u32, &all));
    let mut pass = 0u64.to_le_bytes().to_vec();
    pass.extend_from_slice(&pages.to_le_bytes());
    head.extend(section_bytes(Kind::Pass as u32, &pass));
    s.write_all(&head).unwrap();
    // One zero page, over and over: 32 bytes a section.
    let mut run = 0u64.to_le_bytes().to_vec();
    run.extend_from_slice(&1u32.to_le_bytes());
    run.extend_from_slice(&(format::RunKind::Zero as u32).to_le_bytes());
    let flood = section_bytes(Kind::Ram as u32, &run).repeat(2048);
    let flooding = std::thread::spawn(move || {
        let mut sent = 0u64;
        while s.write_all(&flood).is_ok() {
            sent += 1;
        }
        sent
    });
    let mut c = dest.client();
    wait_for("the stream to load", Duration::from_secs(20), || {
        (query(&mut c).status == Some(Status::Active)).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    c.execute("quit", json!({})).expect("quit");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(dest.join().err());
    });
    let ended = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the destination still loads 30 s after quit");
    let e = ended.expect("a stopped load is an error");
    assert!(e.contains("stopped by quit"), "{e}");
    assert!(flooding.join().unwrap() > 0, "the flood was sent");
}

/// A source VMM stopped while its migration runs says that the migration
/// ended with it (its summary only said the signal), and its exit status
/// stays the stop's.
#[test]
fn a_source_stopped_mid_migration_says_the_migration_ended_with_it() {
    require_kvm!();
    let _serial = common::migration::serial();
    let dir = common::test_dir("mig-src-stopped");
    let socket = dir.join("src.sock");
    let child = common::served_run(&socket)
        .args(["--workload", "dirty ws=16M rate=max for=60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child = common::KillOnDrop::new(child);
    let dest = Dest::start("mig-src-stopped-dst", |_, _| {});
    let mut c =
        kvmscope::client::Client::connect_when_ready(&socket, Duration::from_secs(20), || Ok(()))
            .unwrap();
    c.execute(
        "migrate-set-parameters",
        json!({"max-bandwidth": 1_000_000}),
    )
    .unwrap();
    c.execute("migrate", json!({ "uri": dest.uri })).unwrap();
    wait_for("the migration to run", Duration::from_secs(30), || {
        (query(&mut c).status == Some(Status::Active)).then_some(())
    });
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("the run stopped during a migration (status active), which ended with it"),
        "{err}"
    );
    assert!(
        dest.join().is_err(),
        "the destination refuses the cut stream"
    );
}

/// A COMPLETED whose message is cut short may be one the destination acts
/// on: the source's guest stays paused, as for a COMPLETED that never came
/// (it was resumed: two guests could have run).
#[test]
fn a_completed_cut_short_leaves_the_source_paused() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-cut-done");
    let (uri, fake) = fake_destination("mig-cut-done-dst", Plan::CompletedCut);
    let info = migrate(&src, &uri, json!({}));
    fake.join().unwrap();
    assert_eq!(info.status, Some(Status::Failed), "{info:?}");
    let desc = info.error_desc.unwrap_or_default();
    assert!(desc.contains("ended before its message did"), "{desc}");
    assert!(desc.contains("may be running the guest"), "{desc}");
    let (status, _) = src.client().execute("query-status", json!({})).unwrap();
    assert_eq!(status["status"], "paused", "{status}");
    src.client().execute("cont", json!({})).unwrap();
}

/// A destination that answers COMPLETED before the stream is whole is not
/// believed (the source went postmigrate with its last pages unread): the
/// migration fails and the guest runs on here.
#[test]
fn a_completed_before_the_stream_is_whole_is_not_believed() {
    require_kvm!();
    let _serial = common::migration::serial();
    let src = touched_source("mig-early-done");
    let (uri, fake) = fake_destination("mig-early-done-dst", Plan::CompletedEarly);
    let info = migrate(&src, &uri, json!({}));
    let _ = fake.join();
    let desc = info.error_desc.clone().unwrap_or_default();
    assert!(
        desc.contains("the destination answered COMPLETED before the stream was whole"),
        "{info:?}"
    );
    assert_source_runs_on(&src, &info);
}

/// A destination whose backlog is full accepts nobody: the connect gives up
/// at a cancel (it waited for ever, deaf to it, and no later migration
/// could start).
#[test]
fn a_cancel_ends_a_connect_to_a_destination_that_accepts_nobody() {
    require_kvm!();
    let _serial = common::migration::serial();
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let dir = common::test_dir("mig-backlog");
    let path = dir.join("full.sock");
    let listener = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
    rustix::net::listen(&listener, 0).unwrap();
    // Peers that fill its backlog, never accepted.
    let addr = SocketAddrUnix::new(&path).unwrap();
    let fill: Vec<_> = (0..4)
        .filter_map(|_| {
            let s = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::STREAM,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
                None,
            )
            .unwrap();
            rustix::net::connect(&s, &addr).ok().map(|()| s)
        })
        .collect();
    assert!(!fill.is_empty(), "the backlog takes at least one");
    let src = ServedVm::start("mig-backlog-src", MEM, 1);
    let mut c = src.client();
    c.execute(
        "migrate",
        json!({"uri": format!("unix:{}", path.display())}),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        query(&mut c).status,
        Some(Status::Setup),
        "still connecting"
    );
    c.execute("migrate_cancel", json!({})).unwrap();
    let info = wait_final(&mut c);
    assert_eq!(info.status, Some(Status::Cancelled), "{info:?}");
    drop((fill, listener));
    // The same over TCP: a listener whose accept queue is full drops the
    // SYNs, and the connect waited out its 10 s whatever came.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    rustix::net::listen(&tcp, 0).unwrap();
    let held: Vec<_> = (0..4)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                Duration::from_millis(200),
            )
            .ok()
        })
        .collect();
    c.execute("migrate", json!({"uri": format!("tcp:127.0.0.1:{port}")}))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    if query(&mut c).status == Some(Status::Setup) {
        let asked = std::time::Instant::now();
        c.execute("migrate_cancel", json!({})).unwrap();
        let info = wait_final(&mut c);
        assert_eq!(info.status, Some(Status::Cancelled), "{info:?}");
        // Not a timing goal: the 10 s connect limit is not waited out.
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{:?}",
            asked.elapsed()
        );
    } else {
        // This host's stack took it anyway (syncookies): the migration
        // goes on to the listener, which never reads; cancel it.
        c.execute("migrate_cancel", json!({})).unwrap();
        wait_final(&mut c);
    }
    drop((held, tcp));
}
