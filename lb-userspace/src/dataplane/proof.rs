//! The socket-cookie proof (`cookie-proof`, see `lb_common::proof`): what the programs need
//! from the running kernel to tell a socket that never met socklb with loads alone, tried on
//! two programs of a few instructions before socklb's object is parsed, and written into a
//! copy of that object.
//!
//! The kernel's BTF gives the id of the kfunc `bpf_cast_to_kern_ctx` and where `skc_cookie`
//! and `bpf_sock_addr_kern.sk` sit. The two trial programs (a `cgroup/sock_release` and a
//! `cgroup/getpeername4` one) make exactly the call and loads socklb's programs make, so a
//! kernel that refuses them refuses nothing else of socklb's: the object then carries `r0 = 1`
//! and no-ops where the call and loads would be, and the programs make the cookie with the
//! helper as before. Should socklb's programs still be refused with the proof written, the
//! loader loads them again without it (`loader::load_into`).
use std::{io, path::Path};

use btf_rs::{Backend, Btf, Type};
use lb_common::proof as marks;

use super::{
    features::{Feature, Probe},
    probe::verifier_tail,
    sys::{self, bpf_attach_type, bpf_prog_type},
};

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const KFUNC: &str = "bpf_cast_to_kern_ctx";

/// What the programs' call and loads need from this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// The BTF id of `bpf_cast_to_kern_ctx` in vmlinux.
    pub btf_id: u32,
    /// Where `skc_cookie` sits in `struct sock`, in bytes.
    pub cookie_offset: u16,
    /// Where `sk` sits in `struct bpf_sock_addr_kern`, in bytes.
    pub addr_sk_offset: u16,
}

/// Why the proof is off on this kernel.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    #[error("reading the kernel's BTF ({VMLINUX})")]
    Btf(#[source] btf_rs::Error),
    #[error("the kernel's BTF has no {what} (the kfunc came with 6.2)")]
    Missing { what: &'static str },
    #[error("{what} sits at bit {bits}, past what one load instruction reaches")]
    Offset { what: &'static str, bits: u32 },
    #[error("the kernel refused the trial {program} program{}", verifier_tail(.verifier_log))]
    Refused {
        program: &'static str,
        verifier_log: String,
        #[source]
        source: io::Error,
    },
}

impl ProofError {
    fn errno(&self) -> Option<i32> {
        match self {
            Self::Refused { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// The proof's verdict at start (`disabled`: turned off with `--disable-feature`), with the
/// site when it is on.
pub fn decide(disabled: bool) -> (Option<Site>, Probe) {
    if disabled {
        return (None, Probe::disabled(Feature::CookieProof));
    }
    match find(Path::new(VMLINUX)).and_then(|site| try_site(&site).map(|()| site)) {
        Ok(site) => (Some(site), Probe::enabled(Feature::CookieProof)),
        Err(e) => (None, Probe::refused(Feature::CookieProof, e.errno(), &e)),
    }
}

/// The site, read from the BTF at `path`.
pub fn find(path: &Path) -> Result<Site, ProofError> {
    let btf = Btf::from_file_with_backend(path, Backend::Mmap).map_err(ProofError::Btf)?;
    let btf_id = btf
        .resolve_ids_by_name(KFUNC)
        .unwrap_or_default()
        .into_iter()
        .find(|id| matches!(btf.resolve_type_by_id(*id), Ok(Type::Func(_))))
        .ok_or(ProofError::Missing {
            what: "function bpf_cast_to_kern_ctx",
        })?;
    let cookie_in_common = member_offset(&btf, "sock_common", "skc_cookie")?;
    let common_in_sock = member_offset(&btf, "sock", "__sk_common")?;
    let sum = u32::from(common_in_sock) + u32::from(cookie_in_common);
    Ok(Site {
        btf_id,
        cookie_offset: i16::try_from(sum).map(i16::unsigned_abs).map_err(|_| {
            ProofError::Offset {
                what: "skc_cookie",
                bits: sum * 8,
            }
        })?,
        addr_sk_offset: member_offset(&btf, "bpf_sock_addr_kern", "sk")?,
    })
}

/// The byte offset of `member` in `struct name` (a load's 16-bit offset must reach it).
fn member_offset(btf: &Btf, name: &str, member: &'static str) -> Result<u16, ProofError> {
    for ty in btf.resolve_types_by_name(name).unwrap_or_default() {
        let Type::Struct(s) = ty else { continue };
        for m in &s.members {
            if btf.resolve_name(m).is_ok_and(|n| n == member) {
                let bits = m.bit_offset();
                return match i16::try_from(bits / 8) {
                    Ok(bytes) if bits % 8 == 0 => Ok(bytes.unsigned_abs()),
                    _ => Err(ProofError::Offset { what: member, bits }),
                };
            }
        }
    }
    Err(ProofError::Missing { what: member })
}

/// Loads the call and loads of socklb's programs, alone, on both program types.
pub fn try_site(site: &Site) -> Result<(), ProofError> {
    // r0 = 1; exit
    const RETURN_1: [u64; 2] = [0xb7 | (1 << 32), 0x95];
    let (release, addr) = marks::written(site.btf_id, site.addr_sk_offset, site.cookie_offset);
    for (program, prog_type, attach, insns) in [
        (
            "sock_release",
            bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK,
            bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
            [&release[..], &RETURN_1].concat(),
        ),
        (
            "getpeername4",
            bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
            [&addr[..], &RETURN_1].concat(),
        ),
    ] {
        sys::prog_load(prog_type, attach, 0, &insns, "socklb_proof").map_err(
            |(source, verifier_log)| ProofError::Refused {
                program,
                verifier_log,
                source,
            },
        )?;
    }
    Ok(())
}

/// A copy of `object` with each marker sequence (`lb_common::proof`) written for `site`, or
/// turned off without one, and how many of each kind (release, `sock_addr`) it wrote. In
/// anonymous pages of its own (page-aligned, as aya's parser wants), which go back to the
/// system when the copy is dropped instead of staying in the agent's heap.
pub fn write_into(object: &[u8], site: Option<&Site>) -> io::Result<(AlignedObject, [usize; 2])> {
    let (release, addr) = match site {
        Some(s) => marks::written(s.btf_id, s.addr_sk_offset, s.cookie_offset),
        None => marks::off(),
    };
    let mut bytes = memmap2::MmapMut::map_anon(object.len().max(1))?;
    bytes[..object.len()].copy_from_slice(object);
    let mut written = [0; 2];
    for (kind, (marker, with)) in [
        (&marks::RELEASE[..], &release[..]),
        (&marks::ADDR[..], &addr[..]),
    ]
    .into_iter()
    .enumerate()
    {
        let (marker, with) = (le_bytes(marker), le_bytes(with));
        let mut at = 0;
        while at + marker.len() <= object.len() {
            if bytes[at..at + marker.len()] == marker[..] {
                bytes[at..at + marker.len()].copy_from_slice(&with);
                written[kind] += 1;
                at += marker.len();
            } else {
                at += 1;
            }
        }
    }
    Ok((
        AlignedObject {
            bytes,
            len: object.len(),
        },
        written,
    ))
}

fn le_bytes(insns: &[u64]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// An eBPF object in page-aligned memory of its own.
pub struct AlignedObject {
    bytes: memmap2::MmapMut,
    len: usize,
}

impl AlignedObject {
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marker_sequence_and_nothing_else_is_rewritten() {
        let mut object = vec![7u8; 3];
        object.extend(le_bytes(&marks::ADDR));
        object.extend_from_slice(&[1, 2]);
        object.extend(le_bytes(&marks::RELEASE));
        // A marker alone is no sequence.
        object.extend(le_bytes(&marks::RELEASE[..1]));
        let site = Site {
            btf_id: 4242,
            cookie_offset: 88,
            addr_sk_offset: 8,
        };
        let (out, written) = write_into(&object, Some(&site)).expect("anonymous pages");
        assert_eq!(written, [1, 1]);
        let b = out.bytes();
        assert_eq!(b.len(), object.len());
        assert_eq!(&b[..3], &[7, 7, 7]);
        // call 4242 (kfunc), r0 = *(u64 *)(r0 + 8), r0 = *(u64 *)(r0 + 88)
        assert_eq!(b[3..11], [0x85, 0x20, 0, 0, 0x92, 0x10, 0, 0]);
        assert_eq!(b[11..19], [0x79, 0, 8, 0, 0, 0, 0, 0]);
        assert_eq!(b[19..27], [0x79, 0, 88, 0, 0, 0, 0, 0]);
        assert_eq!(&b[27..29], &[1, 2]);
        assert_eq!(b[29..37], [0x85, 0x20, 0, 0, 0x92, 0x10, 0, 0]);
        assert_eq!(b[37..45], [0x79, 0, 88, 0, 0, 0, 0, 0]);
        assert_eq!(b[45..], object[45..]);
        let (off, written) = write_into(&object, None).expect("anonymous pages");
        assert_eq!(written, [1, 1]);
        // r0 = 1, goto +0, goto +0
        assert_eq!(
            off.bytes()[3..27],
            le_bytes(&[0xb7 | (1 << 32), 0x05, 0x05])[..]
        );
        assert_eq!(off.bytes().as_ptr() as usize % 8, 0);
    }
}
