//! The RAM digest `x-check-ram` asks for: a CRC-32 of all guest RAM, taken
//! by the source at the stop and by the destination after loading.

/// CRC-32 of all of guest RAM, read 1 MiB at a time.
pub(crate) fn ram_crc32(mem: &crate::memory::GuestMemory) -> u32 {
    use vm_memory::Bytes;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let size = crate::memory::size(mem);
    let mut at = 0;
    while at < size {
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
    crc.finalize()
}
