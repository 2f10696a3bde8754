//! The labels every line of a VM carries on the page.

/// The labels of one VM: `vm`, `pid`, `socket`.
pub(crate) fn vm_labels(name: &str, pid: Option<u32>, socket: &std::path::Path) -> String {
    // Not known yet (a QEMU never read): empty, which PromQL reads as no
    // label, rather than a pid that no process has.
    let pid = pid.map(|p| p.to_string()).unwrap_or_default();
    format!(
        "vm=\"{}\",pid=\"{pid}\",socket=\"{}\"",
        crate::metrics::label_value(name),
        crate::metrics::label_value(&socket.to_string_lossy())
    )
}

/// The labels of each of a VM's `vcpus`: the VM's `labels` and the `vcpu` index.
pub(crate) fn vcpu_labels(labels: &str, vcpus: usize) -> Vec<String> {
    (0..vcpus)
        .map(|i| crate::metrics::vcpu_labels(labels, i))
        .collect()
}
