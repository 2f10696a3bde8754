//! The RAM digest `x-check-ram` asks for: a CRC-32 of all guest RAM, taken
//! by the source at the stop and by the destination after loading.

/// CRC-32 of all of guest RAM, read 1 MiB at a time; `None` when `stop`
/// (asked before each MiB) says to stop.
pub(crate) fn ram_crc32(mem: &crate::memory::GuestMemory, stop: &dyn Fn() -> bool) -> Option<u32> {
    use vm_memory::Bytes;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let size = crate::memory::size(mem);
    let mut at = 0;
    while at < size {
        if stop() {
            return None;
        }
        let n = usize::try_from(size - at).map_or(buf.len(), |left| left.min(buf.len()));
        if mem
            .read_slice(&mut buf[..n], vm_memory::GuestAddress(at))
            .is_err()
        {
            buf[..n].fill(0xff);
        }
        crc.update(&buf[..n]);
        at += n as u64;
    }
    Some(crc.finalize())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stop_ends_the_sum_and_none_gives_the_crc_of_all_ram() {
        let mem = crate::memory::create(16 << 20, false).unwrap();
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            asked.get() > 2
        };
        assert_eq!(super::ram_crc32(&mem, &stop), None);
        assert_eq!(asked.get(), 3, "asked before each MiB, up to the stop");
        let zeros = crc32fast::hash(&vec![0u8; 16 << 20]);
        assert_eq!(super::ram_crc32(&mem, &|| false), Some(zeros));
    }
}
