//! Where a stream goes: `unix:PATH` or `tcp:HOST:PORT`, as QEMU's `-incoming`
//! and `migrate` name them.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is neither `unix:PATH` nor `tcp:HOST:PORT`.
    #[error("'{0}' is not a migration URI: use unix:PATH or tcp:HOST:PORT")]
    Uri(String),
    /// Binding the destination's socket failed (URI given).
    #[error("listening on {0}")]
    Listen(String, #[source] std::io::Error),
    /// Accepting the source's connection failed (URI given).
    #[error("waiting for the source on {0}")]
    Accept(String, #[source] std::io::Error),
    /// The source could not connect to the destination (URI given).
    #[error("connecting to {0}")]
    Connect(String, #[source] std::io::Error),
    /// The destination was told to stop before a source connected (URI given).
    #[error("stopped while waiting for the source on {0}")]
    Stopped(String),
}

/// A migration endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uri {
    /// `unix:PATH`: a unix stream socket at PATH.
    Unix(PathBuf),
    /// `tcp:HOST:PORT`, kept as `HOST:PORT` and resolved when used.
    Tcp(String),
}

impl std::str::FromStr for Uri {
    type Err = Error;

    fn from_str(s: &str) -> Result<Uri, Error> {
        match s.split_once(':') {
            Some(("unix", path)) if !path.is_empty() => Ok(Uri::Unix(PathBuf::from(path))),
            Some(("tcp", addr))
                if addr
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
            {
                Ok(Uri::Tcp(addr.to_string()))
            }
            _ => Err(Error::Uri(s.to_string())),
        }
    }
}

impl std::fmt::Display for Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uri::Unix(p) => write!(f, "unix:{}", p.display()),
            Uri::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// One connection, either kind.
#[derive(Debug)]
pub(crate) enum Conn {
    /// Over a unix socket.
    Unix(UnixStream),
    /// Over TCP.
    Tcp(TcpStream),
}

impl Conn {
    /// Connects to a listening destination.
    ///
    /// # Errors
    /// `Connect` with the cause.
    pub(crate) fn connect(uri: &Uri) -> Result<Conn, Error> {
        let failed = |e| Error::Connect(uri.to_string(), e);
        match uri {
            Uri::Unix(path) => UnixStream::connect(path).map(Conn::Unix).map_err(failed),
            Uri::Tcp(addr) => {
                let addrs = addr.to_socket_addrs().map_err(failed)?;
                let mut last = std::io::Error::other("the address resolves to nothing");
                for a in addrs {
                    match TcpStream::connect_timeout(&a, Duration::from_secs(10)) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            return Ok(Conn::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(failed(last))
            }
        }
    }

    /// A second handle on the same connection (to shut it down from another thread).
    ///
    /// # Errors
    /// The fd could not be duplicated.
    pub(crate) fn try_clone(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }

    /// Ends the connection both ways, waking any thread blocked on it.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Limits how long a read may block.
    ///
    /// # Errors
    /// The socket option could not be set.
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(t),
            Conn::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A destination waiting for its one source.
pub(crate) enum Listener {
    /// The socket file is removed when the listener goes.
    Unix(UnixListener, PathBuf),
    /// Listening on TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Listens at `uri`. A unix socket file left by a dead process is replaced.
    ///
    /// # Errors
    /// `Listen` with the cause.
    pub(crate) fn bind(uri: &Uri) -> Result<Listener, Error> {
        let failed = |e| Error::Listen(uri.to_string(), e);
        match uri {
            Uri::Unix(path) => {
                if UnixStream::connect(path).is_err() {
                    let _ = std::fs::remove_file(path);
                }
                let l = UnixListener::bind(path).map_err(failed)?;
                Ok(Listener::Unix(l, path.clone()))
            }
            Uri::Tcp(addr) => TcpListener::bind(addr.as_str())
                .map(Listener::Tcp)
                .map_err(failed),
        }
    }

    /// Waits for the source, looking at `stop` every 100 ms.
    ///
    /// # Errors
    /// `Accept` with the cause, `Stopped` when `stop` said so.
    pub(crate) fn accept(&self, stop: &dyn Fn() -> bool) -> Result<Conn, Error> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        use std::os::fd::AsFd;
        let (fd, name) = match self {
            Listener::Unix(l, p) => (l.as_fd(), format!("unix:{}", p.display())),
            Listener::Tcp(l) => (l.as_fd(), "tcp".to_string()),
        };
        // Woken every 100 ms to look at `stop`.
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        loop {
            if stop() {
                return Err(Error::Stopped(name));
            }
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut fds, Some(&tick)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => {}
                Ok(_) => break,
                Err(e) => return Err(Error::Accept(name, e.into())),
            }
        }
        match self {
            Listener::Unix(l, path) => l
                .accept()
                .map(|(s, _)| Conn::Unix(s))
                .map_err(|e| Error::Accept(format!("unix:{}", path.display()), e)),
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Conn::Tcp(s)
                })
                .map_err(|e| Error::Accept("tcp".into(), e)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_like_qemus() {
        assert_eq!(
            "unix:/tmp/m.sock".parse::<Uri>().unwrap(),
            Uri::Unix("/tmp/m.sock".into())
        );
        assert_eq!(
            "tcp:127.0.0.1:4444".parse::<Uri>().unwrap(),
            Uri::Tcp("127.0.0.1:4444".into())
        );
        for bad in ["", "unix:", "tcp:host", "tcp::80", "file:/x", "tcp:h:99999"] {
            assert!(bad.parse::<Uri>().is_err(), "{bad}");
        }
    }
}
