//! The global descriptor table: flat 64-bit code and data segments for CPL0 and
//! CPL3, and a TSS (x86 will not enter a guest without a usable task register).

use kvm_bindings::kvm_segment;

/// A segment as both the GDT and KVM's `kvm_segment` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Linear base address (ignored in 64-bit mode but for FS, GS and the TSS).
    pub(crate) base: u64,
    /// Limit in units of the granularity (`g`): 0xfffff with g=1 is 4 GiB.
    pub(crate) limit: u32,
    /// The 4-bit type field (code/data access bits, or the system type).
    pub(crate) type_: u8,
    /// Code/data (true) or system (false) segment.
    pub(crate) s: bool,
    /// Descriptor privilege level, 0 to 3.
    pub(crate) dpl: u8,
    /// 64-bit code segment.
    pub(crate) l: bool,
    /// Default operand size 32-bit (must be clear for 64-bit code).
    pub(crate) db: bool,
    /// Limit counts 4 KiB units.
    pub(crate) g: bool,
}

/// GDT slot of the 64-bit user code segment.
pub(crate) const USER_CODE: u16 = 3;
/// GDT slot of the user data segment.
pub(crate) const USER_DATA: u16 = 4;
/// GDT slot of the TSS (a 16-byte descriptor: slots 5 and 6).
pub(crate) const TSS: u16 = 5;
/// Entries in the table.
pub(crate) const ENTRIES: usize = 7;
/// The GDTR limit for [`ENTRIES`] descriptors: the table's last byte.
pub(crate) const TABLE_LIMIT: u16 = 8 * 7 - 1;
const _: () = assert!(TABLE_LIMIT as usize == ENTRIES * 8 - 1);

const fn flat(type_: u8, dpl: u8, l: bool) -> Segment {
    Segment {
        base: 0,
        limit: 0xfffff,
        type_,
        s: true,
        dpl,
        l,
        db: !l,
        g: true,
    }
}

/// 64-bit code, execute/read, accessed.
pub(crate) const fn code(dpl: u8) -> Segment {
    flat(0xb, dpl, true)
}

/// Data, read/write, accessed.
pub(crate) const fn data(dpl: u8) -> Segment {
    flat(0x3, dpl, false)
}

/// Bytes of the 64-bit TSS proper; the I/O permission bitmap follows it.
pub(crate) const TSS_CORE: u16 = 0x68;
/// Offset of the I/O-map-base field in the TSS.
pub(crate) const TSS_IOMAP_BASE_FIELD: usize = 0x66;
/// Bytes of I/O permission bitmap: one bit per port below `abi::TSS_IO_PORTS`.
const TSS_IO_BITMAP: u16 = 0x800 / 8;
const _: () = assert!(TSS_IO_BITMAP as u64 == crate::abi::TSS_IO_PORTS / 8);

/// Last byte of the TSS: core, a bitmap for `abi::TSS_IO_PORTS` ports, and the
/// 0xff byte the architecture requires after the bitmap.
pub(crate) const fn tss_limit() -> u32 {
    TSS_CORE as u32 + TSS_IO_BITMAP as u32
}

/// A busy 64-bit TSS at `base`, with room for the I/O bitmap.
pub(crate) const fn tss(base: u64) -> Segment {
    Segment {
        base,
        limit: tss_limit(),
        type_: 0xb,
        s: false,
        dpl: 0,
        l: false,
        db: false,
        g: false,
    }
}

/// The TSS contents: zeros, the I/O map base pointing just past the core, an
/// all-zero bitmap (every port below `abi::TSS_IO_PORTS` allowed), then 0xff.
pub(crate) fn tss_image() -> Vec<u8> {
    let last = usize::from(TSS_CORE) + usize::from(TSS_IO_BITMAP);
    let mut t = vec![0u8; last + 1];
    let field = TSS_IOMAP_BASE_FIELD;
    t[field..field + 2].copy_from_slice(&TSS_CORE.to_le_bytes());
    t[last] = 0xff;
    t
}

impl Segment {
    /// The low 8 bytes of the segment's GDT descriptor.
    pub(crate) fn descriptor(&self) -> u64 {
        let base = self.base & 0xffff_ffff;
        let limit = u64::from(self.limit & 0xfffff);
        let access = u64::from(self.type_ & 0xf)
            | u64::from(self.s) << 4
            | u64::from(self.dpl & 3) << 5
            | 1 << 7;
        let flags = u64::from(self.l) << 1 | u64::from(self.db) << 2 | u64::from(self.g) << 3;
        (limit & 0xffff)
            | (base & 0xff_ffff) << 16
            | access << 40
            | (limit >> 16) << 48
            | flags << 52
            | (base >> 24) << 56
    }

    /// The segment as KVM takes it, loaded from GDT slot `index` at privilege `rpl`.
    pub(crate) fn kvm(&self, index: u16, rpl: u16) -> kvm_segment {
        let limit = if self.g {
            (self.limit << 12) | 0xfff
        } else {
            self.limit
        };
        kvm_segment {
            base: self.base,
            limit,
            selector: (index << 3) | rpl,
            type_: self.type_,
            present: 1,
            dpl: self.dpl,
            db: u8::from(self.db),
            s: u8::from(self.s),
            l: u8::from(self.l),
            g: u8::from(self.g),
            avl: 0,
            unusable: 0,
            padding: 0,
        }
    }
}

/// The whole table, as little-endian 8-byte entries.
pub(crate) fn table(tss_base: u64) -> [u64; ENTRIES] {
    let t = tss(tss_base);
    [
        0,
        code(0).descriptor(),
        data(0).descriptor(),
        code(3).descriptor(),
        data(3).descriptor(),
        t.descriptor(),
        // Upper half of the 16-byte system descriptor: base bits 32..63.
        tss_base >> 32,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_code_descriptor_matches_the_architectural_encoding() {
        // G=1 L=1 P=1 DPL=3 S=1 type=0xb, limit 0xfffff, base 0.
        assert_eq!(code(3).descriptor(), 0x00af_fb00_0000_ffff);
        assert_eq!(code(0).descriptor(), 0x00af_9b00_0000_ffff);
        assert_eq!(data(3).descriptor(), 0x00cf_f300_0000_ffff);
    }

    #[test]
    fn tss_descriptor_splits_its_base() {
        let d = tss(0x1234_5678).descriptor();
        assert_eq!(d & 0xffff, u64::from(tss_limit()));
        assert_eq!((d >> 16) & 0xff_ffff, 0x34_5678);
        assert_eq!(d >> 56, 0x12);
        assert_eq!((d >> 40) & 0xff, 0x8b);
    }

    #[test]
    fn kvm_segments_carry_selector_rpl_and_byte_limit() {
        let cs = code(3).kvm(USER_CODE, 3);
        assert_eq!(cs.selector, 0x1b);
        assert_eq!((cs.dpl, cs.l, cs.db, cs.limit), (3, 1, 0, 0xffff_ffff));
        let tr = tss(0x2000).kvm(TSS, 0);
        assert_eq!(
            (tr.selector, tr.limit, tr.s, tr.type_),
            (0x28, tss_limit(), 0, 0xb)
        );
    }

    #[test]
    fn tss_bitmap_allows_guest_ports_and_is_terminated() {
        let t = tss_image();
        let base = u16::from_le_bytes([t[0x66], t[0x67]]) as usize;
        assert_eq!(base, 0x68);
        for port in [crate::abi::PORT_READY, crate::abi::PORT_EXIT_TEST] {
            assert_eq!(
                t[base + port as usize / 8] & (1 << (port % 8)),
                0,
                "port {port:#x} allowed"
            );
        }
        assert_eq!(t.last(), Some(&0xff));
        assert!(t.len() as u64 <= crate::abi::PAGE_SIZE);
    }

    #[test]
    fn table_places_user_segments_in_their_slots() {
        let t = table(0x2000);
        assert_eq!(t[0], 0);
        assert_eq!(t[USER_CODE as usize], code(3).descriptor());
        assert_eq!(t[USER_DATA as usize], data(3).descriptor());
        assert_eq!(t[TSS as usize + 1], 0);
    }
}
