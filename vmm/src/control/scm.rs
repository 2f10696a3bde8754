//! Passing file descriptors over a Unix stream socket (`SCM_RIGHTS`), both ways.
//!
//! Our own small wrappers rather than vmm-sys-util's `ScmSocket`: received fds
//! must be close-on-exec (`MSG_CMSG_CLOEXEC`), so that a client which spawns
//! processes does not leak its stats fds into them, and they come back owned
//! (`File`), so that no path can forget to close one.

use std::fs::File;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};

/// Most fds Linux carries in one message (`SCM_MAX_FD`); more fail with EINVAL.
pub const MAX_FDS_PER_MESSAGE: usize = 253;

const FD_SIZE: usize = mem::size_of::<RawFd>();

/// A control-message buffer for `max_fds` fds, 8-byte aligned as `cmsghdr` needs.
fn control_buffer(max_fds: usize) -> Vec<u64> {
    let payload = u32::try_from(max_fds.min(MAX_FDS_PER_MESSAGE) * FD_SIZE).unwrap_or(0);
    // SAFETY: CMSG_SPACE only computes a size.
    let bytes = unsafe { libc::CMSG_SPACE(payload) } as usize;
    vec![0u64; bytes.div_ceil(8)]
}

/// Sends `bytes` with `fds` attached (at most [`MAX_FDS_PER_MESSAGE`]) in one
/// `sendmsg`, without SIGPIPE. Returns the bytes sent; when it is more than 0
/// the fds went with them (the kernel attaches them to the first segment).
///
/// # Errors
/// The `sendmsg` failure (`WouldBlock` on a full non-blocking socket, when
/// nothing was sent and the fds did not go either).
pub fn send_with_fds(
    socket: &impl AsRawFd,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many fds for one message",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = control_buffer(fds.len());
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() * 8;
        // SAFETY: `msg` points at `control`, which has room for one cmsghdr and
        // `fds.len()` fds (control_buffer sized it with CMSG_SPACE), so
        // CMSG_FIRSTHDR is non-null and CMSG_DATA has room for every fd.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN((fds.len() * FD_SIZE) as u32) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` describes `bytes` (read only by the kernel) and a control
    // buffer we own; both outlive the call. The fds are borrowed, so open.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// Receives into `buf` with one `recvmsg`, appending any fds that came along to
/// `fds` (owned, close-on-exec). Returns the bytes read; 0 is end of stream.
///
/// # Errors
/// The `recvmsg` failure, or `InvalidData` when the kernel had to drop fds for
/// lack of room (more than `max_fds`; those that did fit are closed too).
pub fn recv_with_fds(
    socket: &impl AsRawFd,
    buf: &mut [u8],
    fds: &mut Vec<File>,
    max_fds: usize,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = control_buffer(max_fds);
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * 8;
    // SAFETY: `msg` describes `buf` and `control`, both ours and alive for the call.
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    let received = take_fds(&msg);
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        drop(received);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer sent more fds than there was room for",
        ));
    }
    fds.extend(received);
    Ok(read as usize)
}

/// Takes ownership of the fds in a received message's `SCM_RIGHTS` messages.
fn take_fds(msg: &libc::msghdr) -> Vec<File> {
    let mut out = Vec::new();
    // SAFETY: `msg` was filled by a successful recvmsg, so the CMSG_* walk stays
    // within `msg_controllen` bytes of its control buffer; each SCM_RIGHTS
    // payload holds `(cmsg_len - CMSG_LEN(0)) / 4` fds, now owned by this process
    // and by nothing else, so each becomes a `File` exactly once.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len.saturating_sub(libc::CMSG_LEN(0) as usize);
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..payload / FD_SIZE {
                    out.push(File::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    out
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
///
/// # Errors
/// The `getsockopt` failure.
pub fn peer_uid(socket: &impl AsRawFd) -> io::Result<u32> {
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which we own.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

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
        // SAFETY: F_GETFD only reads the flags of an fd we own.
        let flags = unsafe { libc::fcntl(fds[0].as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
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
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(&a).unwrap(), unsafe { libc::geteuid() });
    }
}
