//! `KVM_GET_STATS_FD`: the one ioctl of this crate, and its only unsafe code.
//!
//! kvm-ioctls has no wrapper for it. Everything else in the crate reads the returned fd with
//! safe positioned reads.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

/// `KVMIO`, the ioctl type of every KVM ioctl.
const KVMIO: u32 = 0xAE;

/// The request number, `_IO(KVMIO, 0xce)`; kept private, the helper below is the API.
mod nr {
    use super::{ioctl_io_nr, KVMIO};

    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}

/// `KVM_CAP_BINARY_STATS_FD`, for `KVM_CHECK_EXTENSION` on /dev/kvm.
pub const KVM_CAP_BINARY_STATS_FD: u32 = 203;

/// Why no stats fd could be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel refused `KVM_GET_STATS_FD` (ENOTTY: not a VM or vCPU fd, or a kernel
    /// before 5.14; ENOMEM; EMFILE).
    #[error("KVM_GET_STATS_FD failed")]
    GetStatsFd(#[source] io::Error),
}

/// Issues `KVM_GET_STATS_FD` on a VM or vCPU fd and returns the new stats fd (read-only,
/// close-on-exec). The stats fd holds a reference on the VM: it stays readable after the VM
/// and vCPU fds are closed.
///
/// # Errors
///
/// [`Error::GetStatsFd`] with the kernel's errno.
pub fn get_stats_fd(fd: &impl AsRawFd) -> Result<File, Error> {
    // SAFETY: KVM_GET_STATS_FD takes no argument, so the kernel reads and writes no user
    // memory; on a fd that is not a VM or vCPU fd it fails with ENOTTY. `fd` is borrowed
    // open for the duration of the call.
    let ret = unsafe { ioctl(fd, nr::KVM_GET_STATS_FD()) };
    if ret < 0 {
        return Err(Error::GetStatsFd(io::Error::last_os_error()));
    }
    // SAFETY: on success the ioctl returns a new fd that nothing else owns; the File takes
    // sole ownership and closes it on drop.
    Ok(unsafe { File::from_raw_fd(ret) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_stats_fd_on_plain_file_fails_with_enotty() {
        let Ok(file) = File::open("/dev/null") else {
            return;
        };
        let err = get_stats_fd(&file).err();
        let Some(Error::GetStatsFd(io)) = err else {
            panic!("ioctl on /dev/null succeeded");
        };
        assert_eq!(io.raw_os_error(), Some(25)); // ENOTTY
    }
}
