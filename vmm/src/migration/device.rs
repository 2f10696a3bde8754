//! vCPU state on the wire: a [`VcpuHeader`], then the KVM structs as their
//! bytes (zerocopy, so the sizes are this build's and are checked), the MSRs,
//! and the VMM's part as JSON.

use zerocopy::{FromBytes, IntoBytes};

use super::format::{self, Kind, MsrRecord, VcpuHeader, MAX_MSRS};
use crate::vcpu::snapshot::{KvmState, Snapshot, VmmState};

/// Why a vCPU section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The section is short, long or cut off.
    #[error(transparent)]
    Format(#[from] format::Error),
    /// The header announces more than [`MAX_MSRS`] MSRs.
    #[error("vCPU {index}: {count} MSRs, over the {MAX_MSRS} a section may carry")]
    Msrs {
        /// The vCPU's index.
        index: u32,
        /// The MSR count its header announces.
        count: u32,
    },
    /// The VMM's JSON part does not parse as a [`VmmState`] (vCPU index given).
    #[error("vCPU {0}: its VMM state does not parse")]
    Vmm(u32, #[source] serde_json::Error),
    /// The VMM's state could not be turned into JSON on the source (vCPU index given).
    #[error("vCPU {0}: encoding its VMM state")]
    Encode(usize, #[source] serde_json::Error),
    /// A count does not fit its 32-bit field on the wire (vCPU index and what).
    #[error("vCPU {0}: {1} does not fit the stream's 32-bit field")]
    TooBig(usize, &'static str),
}

fn fixed_len() -> usize {
    size_of::<kvm_bindings::kvm_regs>()
        + size_of::<kvm_bindings::kvm_sregs>()
        + size_of::<kvm_bindings::kvm_xsave>()
        + size_of::<kvm_bindings::kvm_xcrs>()
        + size_of::<kvm_bindings::kvm_debugregs>()
        + size_of::<kvm_bindings::kvm_vcpu_events>()
}

/// A vCPU section's payload.
///
/// # Errors
/// The VMM part could not be encoded.
pub(crate) fn encode(s: &Snapshot) -> Result<Vec<u8>, Error> {
    let vmm = serde_json::to_vec(&s.vmm).map_err(|e| Error::Encode(s.index, e))?;
    let header = VcpuHeader {
        index: u32::try_from(s.index).map_err(|_| Error::TooBig(s.index, "its index"))?,
        msr_count: u32::try_from(s.kvm.msrs.len())
            .map_err(|_| Error::TooBig(s.index, "its MSR list"))?,
        vmm_len: u32::try_from(vmm.len()).map_err(|_| Error::TooBig(s.index, "its VMM state"))?,
        tsc_khz: s.kvm.tsc_khz,
    };
    let k = &s.kvm;
    let mut out = Vec::with_capacity(size_of::<VcpuHeader>() + fixed_len() + vmm.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(k.regs.as_bytes());
    out.extend_from_slice(k.sregs.as_bytes());
    out.extend_from_slice(k.xsave.as_bytes());
    out.extend_from_slice(k.xcrs.as_bytes());
    out.extend_from_slice(k.debug.as_bytes());
    out.extend_from_slice(k.events.as_bytes());
    for &(index, value) in &k.msrs {
        let r = MsrRecord {
            index,
            reserved: 0,
            value,
        };
        out.extend_from_slice(r.as_bytes());
    }
    out.extend_from_slice(&vmm);
    Ok(out)
}

/// Takes the next `T` off the front of `bytes`.
fn take<T: FromBytes>(bytes: &mut &[u8]) -> Result<T, format::Error> {
    let (v, rest) = T::read_from_prefix(bytes).map_err(|_| format::Error::Length {
        what: "vCPU",
        len: bytes.len() as u64,
        need: size_of::<T>() as u64,
    })?;
    *bytes = rest;
    Ok(v)
}

/// Reads a vCPU section's payload, checking that its parts add up to its length.
///
/// # Errors
/// A length that does not add up, too many MSRs, or VMM JSON that does not parse.
pub(crate) fn decode(payload: &[u8]) -> Result<Snapshot, Error> {
    let mut b = payload;
    let h: VcpuHeader = take(&mut b)?;
    if h.msr_count > MAX_MSRS {
        return Err(Error::Msrs {
            index: h.index,
            count: h.msr_count,
        });
    }
    let need = size_of::<VcpuHeader>() as u64
        + fixed_len() as u64
        + u64::from(h.msr_count) * size_of::<MsrRecord>() as u64
        + u64::from(h.vmm_len);
    format::expect_len(Kind::Vcpu, payload.len() as u64, need)?;
    let regs = take(&mut b)?;
    let sregs = take(&mut b)?;
    let xsave = take(&mut b)?;
    let xcrs = take(&mut b)?;
    let debug = take(&mut b)?;
    let events = take(&mut b)?;
    let msrs = (0..h.msr_count)
        .map(|_| take::<MsrRecord>(&mut b).map(|r| (r.index, r.value)))
        .collect::<Result<_, _>>()?;
    let vmm: VmmState = serde_json::from_slice(b).map_err(|e| Error::Vmm(h.index, e))?;
    Ok(Snapshot {
        index: h.index as usize,
        kvm: KvmState {
            regs,
            sregs,
            xsave,
            xcrs,
            debug,
            events,
            msrs,
            tsc_khz: h.tsc_khz,
        },
        vmm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vcpu::snapshot::Site;

    fn snapshot() -> Snapshot {
        let regs = kvm_bindings::kvm_regs {
            rip: 0x20_1000,
            ..Default::default()
        };
        Snapshot {
            index: 2,
            kvm: KvmState {
                regs,
                sregs: Default::default(),
                xsave: Default::default(),
                xcrs: Default::default(),
                debug: Default::default(),
                events: Default::default(),
                msrs: vec![(0x10, 123_456), (0xc000_0080, 0xd01)],
                tsc_khz: 2_000_000,
            },
            vmm: VmmState {
                site: Site::Wait {
                    remaining_us: Some(5),
                },
                current: None,
                queue: vec!["touch size=4096".into()],
                next_seq: 7,
                results: Vec::new(),
                phase: 0x604,
                booted: true,
                reasons: vec![("io_out".into(), 9)],
                devices: Vec::new(),
            },
        }
    }

    #[test]
    fn a_vcpu_round_trips() {
        let bytes = encode(&snapshot()).unwrap();
        let back = decode(&bytes).unwrap();
        assert_eq!(back.index, 2);
        assert_eq!(back.kvm.regs.rip, 0x20_1000);
        assert_eq!(back.kvm.msrs, snapshot().kvm.msrs);
        assert_eq!(back.kvm.tsc_khz, 2_000_000);
        assert_eq!(back.vmm, snapshot().vmm);
    }

    #[test]
    fn a_full_queue_of_the_longest_commands_fits_a_vcpu_section() {
        use crate::vcpu::snapshot::ResultRecord;
        use crate::vcpu::{MAX_QUEUED_COMMANDS, RESULTS_KEPT};
        use crate::workload::parse_command;
        // Every number as long as a guest of 1 TiB lets it be (offsets and
        // sizes are checked against the arena before anything is queued).
        let tib = "1099511623680";
        let longest = [
            format!("dirty offset={tib} ws={tib} rate=18446744073709551615/s for=999999999s seed=18446744073709551615"),
            format!("touch offset={tib} size={tib} stride={tib} pattern=0xffffffffffffffff"),
        ]
        .iter()
        .map(|c| parse_command(c).unwrap().to_string())
        .max_by_key(String::len)
        .unwrap();
        let mut s = snapshot();
        s.vmm.queue = vec![longest.clone(); MAX_QUEUED_COMMANDS];
        s.vmm.results = (0..RESULTS_KEPT as u64)
            .map(|seq| ResultRecord {
                seq,
                command: longest.clone(),
                status: "interrupted: the run stopped".into(),
                values: [u64::MAX; 3],
                host_time_us: u64::MAX,
            })
            .collect();
        let bytes = encode(&s).unwrap();
        assert!(
            bytes.len() as u64 <= super::format::MAX_VCPU_SECTION,
            "{} bytes for a queue of {MAX_QUEUED_COMMANDS} x {longest:?}",
            bytes.len()
        );
        assert_eq!(decode(&bytes).unwrap().vmm.queue.len(), MAX_QUEUED_COMMANDS);
    }

    #[test]
    fn a_vcpu_section_of_the_wrong_length_is_refused() {
        let bytes = encode(&snapshot()).unwrap();
        for cut in [3, 20, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(b' ');
        assert!(decode(&long).is_err(), "one byte too many");
        let mut bad = bytes;
        bad[4] = 0xff; // msr_count far over the limit
        bad[5] = 0xff;
        assert!(matches!(decode(&bad), Err(Error::Msrs { .. })));
    }
}
