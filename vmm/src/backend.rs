//! Which KVM backend runs the guest: hardware VMX (EPT or shadow paging),
//! hardware SVM (NPT or shadow), or a software backend such as PVM. It decides
//! which statistics move, so it is reported with every result.

use std::fs;
use std::path::Path;

/// The backend as `query-vm`, the summary and the samples header carry it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackendInfo {
    /// `vmx`, `svm`, `pvm` or `unknown`.
    pub kind: String,
    /// The kernel module that provides it.
    pub module: String,
    /// Two-dimensional paging (EPT/NPT) rather than shadow page tables.
    pub tdp: bool,
    /// KVM's `tdp_mmu` module parameter, when present.
    pub tdp_mmu: Option<bool>,
    /// In words, e.g. `pvm (software, shadow paging, tdp_mmu=N)`.
    pub description: String,
    /// Stats that stay 0 on this backend even when the event happens.
    pub quiet_stats: Vec<String>,
}

/// The KVM backend of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backend {
    /// `vmx`, `svm`, `pvm` or `unknown`.
    pub(crate) kind: &'static str,
    /// Whether the MMU uses two-dimensional paging (EPT/NPT) instead of shadow page tables.
    pub(crate) tdp: bool,
    /// KVM's `tdp_mmu` module parameter, when present.
    pub(crate) tdp_mmu: Option<bool>,
    /// The kernel module that provides the backend.
    pub(crate) module: &'static str,
}

/// Stats that do not count on a backend even when the event happens, so a 0
/// there is not a measurement (found by experiment; see docs/GUEST_ABI.md).
pub(crate) fn quiet_stats(backend: &Backend) -> &'static [&'static str] {
    match backend.kind {
        "pvm" => &["io_exits"],
        _ => &[],
    }
}

fn param(root: &Path, module: &str, name: &str) -> Option<bool> {
    let v = fs::read_to_string(
        root.join("module")
            .join(module)
            .join("parameters")
            .join(name),
    )
    .ok()?;
    match v.trim() {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// Detects the backend from `/sys` (`root` is normally `/sys`).
pub(crate) fn detect_in(root: &Path) -> Backend {
    let loaded = |m: &str| root.join("module").join(m).exists();
    let tdp_mmu = param(root, "kvm", "tdp_mmu");
    let (kind, module, tdp) = if loaded("kvm_intel") {
        (
            "vmx",
            "kvm_intel",
            param(root, "kvm_intel", "ept").unwrap_or(false),
        )
    } else if loaded("kvm_amd") {
        (
            "svm",
            "kvm_amd",
            param(root, "kvm_amd", "npt").unwrap_or(false),
        )
    } else if loaded("kvm_pvm") {
        ("pvm", "kvm_pvm", false)
    } else {
        ("unknown", "unknown", false)
    };
    Backend {
        kind,
        tdp,
        tdp_mmu,
        module,
    }
}

/// Detects this host's backend.
pub(crate) fn detect() -> Backend {
    detect_in(Path::new("/sys"))
}

impl Backend {
    /// A one-line description, e.g. `vmx with EPT (tdp_mmu=Y)`.
    pub(crate) fn describe(&self) -> String {
        let paging = match (self.kind, self.tdp) {
            ("vmx", true) => "EPT",
            ("svm", true) => "NPT",
            _ => "shadow paging",
        };
        let soft = if self.kind == "pvm" {
            "software backend, "
        } else {
            ""
        };
        let mmu = match self.tdp_mmu {
            Some(true) => ", tdp_mmu=Y",
            Some(false) => ", tdp_mmu=N",
            None => "",
        };
        format!("{} ({soft}{paging}{mmu})", self.kind)
    }

    /// The backend as the wire and the reports show it.
    pub(crate) fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: self.kind.to_string(),
            module: self.module.to_string(),
            tdp: self.tdp,
            tdp_mmu: self.tdp_mmu,
            description: self.describe(),
            quiet_stats: quiet_stats(self).iter().map(ToString::to_string).collect(),
        }
    }

    /// The backend as JSON ([`BackendInfo`]).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.info()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sys(modules: &[(&str, &[(&str, &str)])]) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        for (m, params) in modules {
            let p = dir.path().join("module").join(m).join("parameters");
            fs::create_dir_all(&p).unwrap();
            for (k, v) in *params {
                fs::write(p.join(k), format!("{v}\n")).unwrap();
            }
        }
        dir
    }

    #[test]
    fn detects_vmx_with_ept() {
        let d = fake_sys(&[("kvm", &[("tdp_mmu", "Y")]), ("kvm_intel", &[("ept", "Y")])]);
        let b = detect_in(d.path());
        assert_eq!((b.kind, b.tdp, b.tdp_mmu), ("vmx", true, Some(true)));
        assert_eq!(b.describe(), "vmx (EPT, tdp_mmu=Y)");
    }

    #[test]
    fn detects_svm_without_npt_as_shadow() {
        let d = fake_sys(&[("kvm", &[]), ("kvm_amd", &[("npt", "0")])]);
        let b = detect_in(d.path());
        assert_eq!((b.kind, b.tdp), ("svm", false));
        assert!(b.describe().contains("shadow paging"));
    }

    #[test]
    fn detects_pvm_as_software_shadow_with_quiet_stats() {
        let d = fake_sys(&[("kvm", &[("tdp_mmu", "N")]), ("kvm_pvm", &[])]);
        let b = detect_in(d.path());
        assert_eq!(
            b.describe(),
            "pvm (software backend, shadow paging, tdp_mmu=N)"
        );
        assert!(quiet_stats(&b).contains(&"io_exits"));
    }

    #[test]
    fn no_kvm_module_is_unknown() {
        let d = fake_sys(&[]);
        assert_eq!(detect_in(d.path()).kind, "unknown");
    }

    /// A temporary directory removed on drop (std has none).
    mod tempdir {
        pub(crate) struct Dir(std::path::PathBuf);
        impl Dir {
            pub(crate) fn new() -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("kvmscope-backend-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub(crate) fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
