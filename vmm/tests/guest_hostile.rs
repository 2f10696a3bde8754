//! Guests that abuse the guest ABI, on real KVM: text meant for the
//! operator's terminal, a console flood, a READY in the middle of a command,
//! a check-in that is not READY. Each is a few hand-assembled instructions
//! (`common::elf`) booted with `kvmscope run --guest`; the VMM must show
//! what the guest did without letting it write beyond its line, lose no
//! command, and carry on.

mod common;

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::elf::ElfImage;

/// The vCPU 0 mailbox's text field (`MAILBOX_BASE + TEXT`).
const TEXT: u32 = 0x10_0098;

/// Text a guest might aim at the terminal: an OSC 52 clipboard write and a
/// window title, a carriage return, a line of its own, a bidirectional
/// override, invalid UTF-8.
const HOSTILE: &[u8] = b"\x1b]52;c;ZWNobyBQV05FRAo=\x07\x1b]0;title\x07innocent\rOVERWRITTEN\n\
vcpu0: forged line \xe2\x80\xaeevil\xe2\x80\xac \xff";

/// Code that copies `text` (placed after it) into the mailbox's text field,
/// then runs `then`, which must end in a jump: `lea rsi, [rip + text]`,
/// `mov edi, TEXT`, `mov ecx, len`, `rep movsb`.
fn with_text(text: &[u8], then: &[u8]) -> Vec<u8> {
    let len = u32::try_from(text.len()).unwrap();
    let mut after_lea = vec![0xbf];
    after_lea.extend_from_slice(&TEXT.to_le_bytes());
    after_lea.push(0xb9);
    after_lea.extend_from_slice(&len.to_le_bytes());
    after_lea.extend_from_slice(&[0xf3, 0xa4]);
    after_lea.extend_from_slice(then);
    let disp = u32::try_from(after_lea.len()).unwrap();
    let mut code = vec![0x48, 0x8d, 0x35];
    code.extend_from_slice(&disp.to_le_bytes());
    code.extend_from_slice(&after_lea);
    code.extend_from_slice(text);
    code
}

/// `mov eax, len; mov edx, port` then `out dx, eax` (and `then`).
fn out_len(port: u16, len: usize, then: &[u8]) -> Vec<u8> {
    let mut code = vec![0xb8];
    code.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
    code.push(0xba);
    code.extend_from_slice(&u32::from(port).to_le_bytes());
    code.push(0xef);
    code.extend_from_slice(then);
    code
}

/// Writes a guest of `code` at the image base, for `--guest`.
fn guest(test: &str, code: &[u8]) -> (common::TestDir, std::path::PathBuf) {
    let dir = common::test_dir(test);
    let path = dir.join("guest.elf");
    let image = ElfImage::exec(kvmscope::abi::IMAGE_BASE, code).bytes();
    std::fs::write(&path, image).unwrap();
    (dir, path)
}

fn run(guest: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvmscope"));
    c.args(["run", "--memory", "32M", "--guest"])
        .arg(guest)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Nothing the guest wrote reaches the terminal as a control: no ESC, BEL,
/// CR or bidi override, and no line of its own.
fn assert_shown_escaped(what: &str, text: &str) {
    for c in ['\u{1b}', '\u{7}', '\r', '\u{202e}'] {
        assert!(!text.contains(c), "{what} carries {c:?}: {text}");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("vcpu0: forged")),
        "{what}: the guest wrote a line of its own: {text}"
    );
    assert!(text.contains("\\u{1b}]52;c;"), "{what}: {text}");
}

#[test]
fn a_guest_panic_message_reaches_the_terminal_escaped() {
    require_kvm!();
    // PANIC with the text's length, then spin.
    let code = with_text(
        HOSTILE,
        &out_len(kvmscope::abi::PORT_PANIC, HOSTILE.len(), &[0xeb, 0xfe]),
    );
    let (_dir, path) = guest("hostile-panic", &code);
    let out = run(&path, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a guest failure");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the guest failed: vCPU 0: guest panic"),
        "{stderr}"
    );
    assert_shown_escaped("the summary", &stdout);
    assert_shown_escaped("the error line", &stderr);
}

/// A guest that writes a console line as fast as it can exit, and never
/// sends READY: its first port write checks it in (it was stopped at the
/// boot deadline, "no first port write", status 5), its lines are logged at
/// most 20 a second, escaped, the rest counted; a SIGTERM ends the run.
#[test]
fn a_console_flood_is_logged_escaped_at_its_rate_and_checks_the_guest_in() {
    require_kvm!();
    // Copy the text once, then `out CONSOLE` in a loop.
    let code = with_text(
        HOSTILE,
        &out_len(
            kvmscope::abi::PORT_CONSOLE,
            HOSTILE.len(),
            &[0xef, 0xeb, 0xfd],
        ),
    );
    let (_dir, path) = guest("hostile-console", &code);
    let child = run(&path, &["--boot-timeout", "1s"])
        .env("RUST_LOG", "info")
        // No colours, whatever the environment forces: escapes of our own.
        .env("RUST_LOG_STYLE", "never")
        .spawn()
        .unwrap();
    let child = common::KillOnDrop::new(child);
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: kill on a child of ours that has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stopped by the signal, not the boot deadline ({:?}): {}",
        out.status.signal(),
        stderr.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    let shown: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("vcpu0 console: \\u{1b}"))
        .collect();
    assert!(!shown.is_empty(), "no console line logged");
    // Three seconds and a bit: at most four seconds' worth.
    assert!(shown.len() <= 4 * 20, "{} lines logged", shown.len());
    assert!(stderr.contains("more lines not shown"), "the rest counted");
    assert_shown_escaped("the log", &stderr);
}

/// A READY while a command runs asks for a first command again: the one
/// running ends with a status saying it has no result (it was dropped, its
/// client answered with no results and the summary without it).
#[test]
fn a_ready_in_the_middle_of_a_command_loses_no_command() {
    require_kvm!();
    let mut code = vec![0xba, 0x11, 0x05, 0x00, 0x00, 0xef, 0xef];
    // loop: mov rax, [seq]; mov [result_seq], rax; mov qword [status], 0;
    // mov edx, DONE; out dx, eax; jmp loop
    let body: &[u8] = &[
        0x48, 0x8b, 0x04, 0x25, 0x38, 0x00, 0x10, 0x00, // mov rax, [0x100038]
        0x48, 0x89, 0x04, 0x25, 0x70, 0x00, 0x10, 0x00, // mov [0x100070], rax
        0x48, 0xc7, 0x04, 0x25, 0x78, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0xba, 0x12, 0x05,
        0x00, 0x00, // mov edx, 0x512
        0xef, // out dx, eax
    ];
    code.extend_from_slice(body);
    let back = -i8::try_from(body.len() + 2).unwrap();
    code.extend_from_slice(&[0xeb, back.to_le_bytes()[0]]);
    let (_dir, path) = guest("hostile-ready", &code);
    let out = run(
        &path,
        &[
            "--workload",
            "touch size=4K; touch size=8K; read size=4K",
            "--json",
        ],
    )
    .output()
    .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let results = summary["vcpus"][0]["commands"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let statuses: Vec<&str> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(statuses.len(), 3, "every command has a result: {summary}");
    assert!(
        statuses[0].contains("READY") && statuses[0].contains("no result"),
        "{statuses:?}"
    );
    assert_eq!(&statuses[1..], ["ok", "ok"], "{statuses:?}");
}
