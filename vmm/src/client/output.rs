//! Standard output for the client commands (`stats`, `watch`, `ctl`,
//! `readiness`, `migrate`), and what a reader that goes away does to them.

/// Standard output for the client commands: a reader that went away (`stats
/// | head -1`) ends the command quietly with status 0, as it ends other Unix
/// tools, instead of an error that would blame the VMM (`talking to the VMM:
/// Broken pipe`). The VMM and the exporter never write here.
pub struct Stdout {
    out: std::io::StdoutLock<'static>,
    /// What a reader that went away does: end the command (status 0), or,
    /// for `migrate`, whose status is the migration's, leave the rest of its
    /// output unwritten and let it follow the migration to its end.
    on_gone: OnGone,
    gone: bool,
}

/// What a client does when the reader of its output goes away.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnGone {
    /// End the process, status 0, as other Unix tools end.
    Exit,
    /// Drop the rest of the output and go on (`migrate`: its status is the migration's).
    Discard,
}

impl Stdout {
    /// Standard output, locked; a reader gone ends the command (status 0).
    #[must_use]
    pub fn lock() -> Stdout {
        Stdout::with(OnGone::Exit)
    }

    /// Standard output, locked, doing `on_gone` when the reader goes.
    #[must_use]
    pub fn with(on_gone: OnGone) -> Stdout {
        Stdout {
            out: std::io::stdout().lock(),
            on_gone,
            gone: false,
        }
    }

    /// A write's error: passed on, unless it says the reader went away.
    fn gone(&mut self, e: std::io::Error, len: usize) -> std::io::Result<usize> {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e);
        }
        match self.on_gone {
            OnGone::Exit => std::process::exit(0),
            OnGone::Discard => {
                self.gone = true;
                Ok(len)
            }
        }
    }
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.gone {
            return Ok(buf.len());
        }
        match self.out.write(buf) {
            Ok(n) => Ok(n),
            Err(e) => self.gone(e, buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.gone {
            return Ok(());
        }
        match self.out.flush() {
            Ok(()) => Ok(()),
            Err(e) => self.gone(e, 0).map(drop),
        }
    }
}
