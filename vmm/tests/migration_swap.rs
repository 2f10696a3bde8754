//! A page swapped out to disk holds data and must be sent, although
//! `mincore` says "not resident" for it as for a page never touched. With
//! swap (an existing one, or, as root, a small swap file made for the test),
//! a page of an anonymous mapping is pushed out with MADV_PAGEOUT and the
//! migration's page classification, and the readiness scan, must still call
//! it data.

use std::path::PathBuf;
use std::process::Command;

use kvmscope::backing::{classify, Backing};
use kvmscope::readiness::scan::{pages_to_read, scan, Ram};
use vm_memory::{Bytes, VolatileMemory};

struct SwapFile(Option<PathBuf>);

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = Command::new("swapoff").arg(&p).status();
            let _ = std::fs::remove_file(p);
        }
    }
}

fn swap_active() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// Swap for the test: what the host has, or a 32 MiB file made now (root only).
fn ensure_swap() -> Result<SwapFile, String> {
    if swap_active() {
        return Ok(SwapFile(None));
    }
    let path = std::env::temp_dir().join(format!("kvmscope-test-swap-{}", std::process::id()));
    let file = SwapFile(Some(path.clone()));
    let run = |cmd: &mut Command| -> Result<(), String> {
        match cmd.output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    };
    run(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", path.display()),
        "bs=1M",
        "count=32",
    ]))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    run(Command::new("mkswap").arg(&path))?;
    run(Command::new("swapon").arg(&path))?;
    Ok(file)
}

/// This process's page-map entry for the page at `addr`.
fn pagemap_entry(addr: u64) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.seek(SeekFrom::Start(addr / 4096 * 8)).unwrap();
    let mut b = [0u8; 8];
    f.read_exact(&mut b).unwrap();
    u64::from_ne_bytes(b)
}

#[test]
fn a_swapped_out_page_is_classified_as_data_not_as_never_backed() {
    let _swap = match ensure_swap() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("skipping: no swap can be had here ({why}); the unit test on a fabricated pagemap covers the classification");
            return;
        }
    };
    let len = 16 * 4096;
    let region = vm_memory::MmapRegion::<()>::new(len).unwrap();
    let ram = region.as_volatile_slice();
    // A non-zero byte makes page 5 worth sending.
    ram.write_obj(0x5au8, 5 * 4096).unwrap();
    // SAFETY: page 5 lies inside the mapping.
    let page = unsafe { region.as_ptr().add(5 * 4096) };
    // SAFETY: advises on one page of our own mapping.
    let rc = unsafe { libc::madvise(page.cast(), 4096, libc::MADV_PAGEOUT) };
    let swapped = pagemap_entry(page as u64) & (1 << 62) != 0;
    let runs = classify(&region).unwrap();
    // The readiness scan's map of what to read, taken while it is out.
    let to_read = pages_to_read(&region, || std::ops::ControlFlow::Continue(()))
        .unwrap()
        .unwrap();
    // Reading the page back swaps it in.
    let back: u8 = ram.read_obj(5 * 4096).unwrap();
    if rc != 0 || !swapped {
        eprintln!("skipping: the kernel did not swap the page out (madvise rc {rc})");
        return;
    }
    assert!(
        runs.contains(&(5, 1, Backing::Data)),
        "the page is in swap and holds data: {runs:?}"
    );
    assert_eq!(back, 0x5a);
    // The exact scan reads it (and counts it non-zero); the pages never
    // touched it counts as zero unread.
    assert_eq!(to_read[5], 1, "{to_read:?}");
    // SAFETY: the mapping lives and nothing else writes it meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), len) };
    let s = scan(&Ram::from_slice(bytes), Some(&to_read), 0..16, |_, _| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(s.nonzero_in_range, 1, "{s:?}");
    assert_eq!(s.unbacked_pages, 15, "{s:?}");
}
