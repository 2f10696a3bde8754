//! Why the control plane could not start or stopped serving.

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `dup` of the VM fd or a vCPU stats fd failed.
    #[error("duplicating a VMM fd")]
    Dup(#[source] std::io::Error),
    /// The socket file could not be set up at its path.
    #[error(transparent)]
    Socket(#[from] crate::socket_file::Error),
    /// `KVM_GET_STATS_FD` on the VM failed.
    #[error("opening a stats fd")]
    StatsFd(#[from] kvm_stats::ioctl::Error),
    /// The VMM's own stats files could not be made.
    #[error("making the VMM's own stats files")]
    VmmStats(#[from] crate::vmmstats::Error),
    /// A stats fd's header or descriptors could not be read.
    #[error("reading a stats fd")]
    Stats(#[from] kvm_stats::Error),
    /// An eventfd or the deadline timer could not be created, or the listener
    /// could not be made non-blocking.
    #[error("creating the control thread's eventfds and timer")]
    EventFd(#[source] std::io::Error),
    /// The epoll-based event manager could not be made or take a subscriber.
    #[error("setting up the control thread's event manager")]
    EventManager(#[source] event_manager::Error),
    /// The `control` thread could not be spawned.
    #[error("starting the control thread")]
    Spawn(#[source] std::io::Error),
    /// The control thread's epoll loop failed: the socket stopped serving.
    #[error("the control socket stopped serving")]
    Serve(#[source] event_manager::Error),
    /// The control thread panicked.
    #[error("the control thread panicked")]
    Panicked,
    /// The control thread could not be told to stop (it is left running).
    #[error("signalling the control thread to stop")]
    Signal(#[source] std::io::Error),
}
