//! Passing file descriptors over a Unix stream socket (`SCM_RIGHTS`), both ways,
//! in safe code on rustix, and the peer's credentials (`SO_PEERCRED`), read
//! with libc (rustix's `UCred` holds a non-zero pid, and the kernel gives 0
//! for a peer outside this pid namespace).
//!
//! Received fds are close-on-exec (`MSG_CMSG_CLOEXEC`), so that a client which
//! spawns processes does not leak its stats fds into them, and they come back
//! owned (`File`), so that no path can forget to close one: rustix's receive
//! buffer closes whatever is not taken out of it.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Most fds Linux carries in one message (`SCM_MAX_FD`); more fail with EINVAL.
pub(crate) const MAX_FDS_PER_MESSAGE: usize = 253;

/// Room for one `SCM_RIGHTS` message of up to `max_fds` fds.
fn control_space(max_fds: usize) -> Vec<MaybeUninit<u8>> {
    vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.min(MAX_FDS_PER_MESSAGE)))]
}

/// Sends `bytes` with `fds` attached (at most [`MAX_FDS_PER_MESSAGE`]) in one
/// `sendmsg`, without SIGPIPE. Returns the bytes sent; when it is more than 0
/// the fds went with them (the kernel attaches them to the first segment).
///
/// # Errors
/// `InvalidInput` for too many fds, or the `sendmsg` failure (`WouldBlock` on
/// a full non-blocking socket, when nothing was sent and the fds did not go
/// either).
pub(crate) fn send_with_fds(
    socket: impl AsFd,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many fds for one message",
        ));
    }
    let mut space = control_space(fds.len());
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        // control_space() sized the buffer for these fds.
        return Err(io::Error::other(
            "no room for the fds in the control message",
        ));
    }
    let sent = sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(sent)
}

/// Receives into `buf` with one `recvmsg`, appending any fds that came along to
/// `fds` (owned, close-on-exec). Returns the bytes read; 0 is end of stream.
///
/// # Errors
/// The `recvmsg` failure, or `InvalidData` when the kernel had to drop fds for
/// lack of room or more than `max_fds` came (all of them are closed).
pub(crate) fn recv_with_fds(
    socket: impl AsFd,
    buf: &mut [u8],
    fds: &mut Vec<File>,
    max_fds: usize,
) -> io::Result<usize> {
    let mut space = control_space(max_fds);
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(
        socket,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut received = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(owned) = message {
            received.extend(owned.map(File::from));
        }
    }
    // A socket among them (a peer may send any fd) is closed without
    // lingering: one whose SO_LINGER holds unsent data would block the
    // close that drops it, for up to the time it sets (a hostile VMM's
    // TCP socket held an exporter thread in close for 3000 s). Not a
    // socket: ENOTSOCK, nothing to do.
    for f in &received {
        let _ = rustix::net::sockopt::set_socket_linger(f, None);
    }
    // The control buffer is rounded up for alignment, so it may hold a few
    // more than `max_fds`: those are refused too, and closed with the rest.
    if msg.flags.contains(ReturnFlags::CTRUNC) || received.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer sent more fds than there was room for",
        ));
    }
    fds.append(&mut received);
    Ok(msg.bytes)
}

/// Makes a listening socket refuse fds: a peer's `sendmsg` with
/// `SCM_RIGHTS` fails with EPERM (`SO_PASSRIGHTS` 0, Linux 6.16 and
/// later; the connections it accepts take it from it). A socket that takes
/// no fds then never holds any in its queue, which its close would release
/// on the closing thread: a TCP socket with unsent data and `SO_LINGER`
/// among them blocks that close for as long as it sets, nested in a Unix
/// socket's queue too. Returns whether the kernel has the option.
pub(crate) fn refuse_fds(socket: impl AsFd) -> bool {
    /// `SO_PASSRIGHTS` (asm-generic; checked on this kernel: a peer's send
    /// of an fd is refused with EPERM, before and after the accept).
    const SO_PASSRIGHTS: libc::c_int = 83;
    let off: libc::c_int = 0;
    // An int's 4 bytes.
    let len: libc::socklen_t = 4;
    // SAFETY: `off` is an int, as the option takes; the fd is borrowed for
    // the call.
    let r = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&raw const off).cast(),
            len,
        )
    };
    r == 0
}

/// Who is at the other end of a Unix socket (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCred {
    /// Its process, as this process's pid namespace numbers it; `None` for
    /// one this namespace cannot see (the kernel says 0).
    pub(crate) pid: Option<u32>,
    /// Its user.
    pub(crate) uid: u32,
}

/// The credentials of the process at the other end of a Unix socket.
///
/// # Errors
/// The `getsockopt` failure.
pub(crate) fn peer_cred(socket: impl AsFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    // 12 bytes: it fits.
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cred` is a `ucred` and `len` its size, as SO_PEERCRED
    // writes; the fd is borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: u32::try_from(cred.pid).ok().filter(|&p| p > 0),
        uid: cred.uid,
    })
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
///
/// # Errors
/// The `getsockopt` failure.
pub(crate) fn peer_uid(socket: impl AsFd) -> io::Result<u32> {
    Ok(peer_cred(socket)?.uid)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    use rustix::io::{fcntl_getfd, FdFlags};

    use super::*;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn fds_arrive_with_their_bytes_and_are_close_on_exec() {
        let (a, b) = pair();
        let file = File::open("/proc/self/stat").unwrap();
        assert_eq!(
            send_with_fds(&a, b"hello\n", &[file.as_fd(), file.as_fd()]).unwrap(),
            6
        );
        let mut buf = [0u8; 64];
        let mut fds = Vec::new();
        let n = recv_with_fds(&b, &mut buf, &mut fds, 8).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"hello\n"[..], 2));
        assert!(fcntl_getfd(&fds[0]).unwrap().contains(FdFlags::CLOEXEC));
    }

    #[test]
    fn too_many_fds_for_the_receiver_is_an_error_and_closes_them() {
        let (a, b) = pair();
        let file = File::open("/proc/self/stat").unwrap();
        send_with_fds(&a, b"x", &[file.as_fd(), file.as_fd(), file.as_fd()]).unwrap();
        let mut fds = Vec::new();
        let e = recv_with_fds(&b, &mut [0u8; 8], &mut fds, 1).unwrap_err();
        assert_eq!((e.kind(), fds.len()), (io::ErrorKind::InvalidData, 0));
    }

    #[test]
    fn plain_bytes_arrive_without_fds() {
        let (mut a, b) = pair();
        a.write_all(b"abc").unwrap();
        let mut fds = Vec::new();
        let mut buf = [0u8; 8];
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds, 4).unwrap(), 3);
        assert!(fds.is_empty());
    }

    #[test]
    fn the_kernel_limit_of_fds_goes_in_one_message() {
        let (a, b) = pair();
        let file = File::open("/proc/self/stat").unwrap();
        let most = vec![file.as_fd(); MAX_FDS_PER_MESSAGE];
        assert_eq!(send_with_fds(&a, b"x", &most).unwrap(), 1);
        let mut fds = Vec::new();
        recv_with_fds(&b, &mut [0u8; 4], &mut fds, MAX_FDS_PER_MESSAGE).unwrap();
        assert_eq!(fds.len(), MAX_FDS_PER_MESSAGE);
    }

    #[test]
    fn sending_more_than_the_kernel_limit_is_refused() {
        let (a, mut b) = pair();
        let file = File::open("/proc/self/stat").unwrap();
        let many = vec![file.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        assert_eq!(
            send_with_fds(&a, b"x", &many).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        drop(a);
        assert_eq!(b.read(&mut [0u8; 4]).unwrap(), 0);
    }

    #[test]
    fn peer_uid_of_a_socketpair_is_ours() {
        let (a, _b) = pair();
        // /proc/self belongs to the process' effective uid.
        let euid = std::fs::metadata("/proc/self").unwrap().uid();
        assert_eq!(peer_uid(&a).unwrap(), euid);
        assert_eq!(peer_cred(&a).unwrap().pid, Some(std::process::id()));
    }

    #[test]
    fn a_socket_that_refuses_fds_makes_a_peers_send_of_one_fail() {
        let (a, b) = pair();
        if !refuse_fds(&b) {
            // A kernel before 6.16: nothing to check.
            return;
        }
        let (r, _w) = pair();
        let e = send_with_fds(&a, b"x", &[r.as_fd()]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        // Bytes alone still go.
        send_with_fds(&a, b"y", &[]).unwrap();
    }
}
