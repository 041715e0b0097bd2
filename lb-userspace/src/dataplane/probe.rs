//! Trying each optional part against the running kernel (see `features`). The agent runs these
//! probes on its real maps and keeps what loads, pinned (the iterators; the release program is
//! loaded here and attached by the loader's `attach`); `socklb version --features` runs the same
//! probes on throwaway maps (`loader::probe_kernel`), so a node can be checked before installing.
//!
//! Errors are `ProbeError`. `kernel_refusal` tells the kernel's refusal of a program (its errno
//! and verifier log) from other load errors, for `ProbeError` and the loader's `LoadError` alike.
use std::{
    collections::BTreeSet,
    io,
    net::UdpSocket,
    os::fd::{AsFd as _, BorrowedFd},
    path::Path,
};

use aya::{Ebpf, programs::Program};
use lb_common::program;

use super::{
    features::{Feature, Features, Probe},
    pins::{ITER_PIN, LEGACY_UDP_ITER_PIN, UDP_ITER_PIN},
    sock_diag, sys,
};

/// Why an optional part did not load.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "the kernel's BTF (/sys/kernel/btf/vmlinux) is unavailable ({reason}); iterators need it"
    )]
    Btf { reason: String },
    #[error("program {program} is missing from the eBPF object")]
    Missing { program: &'static str },
    #[error("the kernel refused program {program}{}", verifier_tail(.verifier_log))]
    Refused {
        program: &'static str,
        verifier_log: String,
        #[source]
        source: io::Error,
    },
    #[error("program {program}")]
    Program {
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("creating the link of {program}")]
    Link {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("pinning {}", .path.display())]
    Pin {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("asking sock_diag for socket storage")]
    SockDiag(#[source] sock_diag::SockDiagError),
    #[error("a loopback UDP socket to try SOCK_DESTROY on")]
    Socket(#[source] io::Error),
    #[error("the kernel did not destroy the probe's own socket (it answered ENOENT)")]
    NotDestroyed,
}

impl ProbeError {
    /// The kernel's errno, where it answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Refused { source, .. }
            | Self::Link { source, .. }
            | Self::Pin { source, .. }
            | Self::Socket(source) => source.raw_os_error(),
            Self::SockDiag(e) => e.errno().or_else(|| match e {
                sock_diag::SockDiagError::Io { source, .. } => source.raw_os_error(),
                _ => None,
            }),
            Self::Program { source, .. } => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(c) = cause {
                    if let Some(io) = c.downcast_ref::<io::Error>() {
                        return io.raw_os_error();
                    }
                    cause = c.source();
                }
                None
            }
            Self::Btf { .. } | Self::Missing { .. } | Self::NotDestroyed => None,
        }
    }

    /// A program load the kernel refused, keeping its errno as the source and the verifier's
    /// output for the message (printed once).
    pub fn from_program(program: &'static str, e: aya::programs::ProgramError) -> Self {
        match kernel_refusal(e) {
            Ok((verifier_log, source)) => Self::Refused {
                program,
                verifier_log,
                source,
            },
            Err(source) => Self::Program { program, source },
        }
    }
}

/// The last lines of a verifier log, for a message.
pub fn verifier_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(12)..];
    format!("; the verifier said:\n  {}\n", tail.join("\n  "))
}

/// Tries every optional part but the cookie proof, whose verdict `cookie_proof` is (written
/// into the object before it was parsed). `sockets_map` is the `SOCKETS` map the iterators read; with
/// `pins` the iterators' links are pinned there (and stale pins of refused or disabled ones
/// removed), without it they are dropped again.
pub fn probe_all(
    ebpf: &mut Ebpf,
    sockets_map: BorrowedFd<'_>,
    disabled: &BTreeSet<Feature>,
    pins: Option<&Path>,
    cookie_proof: &Probe,
) -> Features {
    let btf = aya::Btf::from_sys_fs();
    let with_btf = |f: &mut dyn FnMut(&aya::Btf) -> Result<(), ProbeError>| match &btf {
        Ok(btf) => f(btf),
        Err(e) => Err(ProbeError::Btf {
            reason: e.to_string(),
        }),
    };
    if let Some(dir) = pins {
        // An older agent's UDP iterator writes another entry layout: no reader may take it.
        let _ = std::fs::remove_file(dir.join(LEGACY_UDP_ITER_PIN));
    }
    let mut probes = Vec::new();
    for feature in Feature::ALL {
        let probe = if feature == Feature::CookieProof {
            // Decided before the object was parsed (`proof::decide`).
            cookie_proof.clone()
        } else if disabled.contains(&feature) {
            Probe::disabled(feature)
        } else {
            let result = match feature {
                Feature::SocketsIterator => {
                    with_btf(&mut |btf| sockets_iterator(ebpf, btf, sockets_map, pins))
                }
                Feature::UdpIterator => with_btf(&mut |btf| udp_iterator(ebpf, btf, pins)),
                Feature::SockDiagStorage => sock_diag_storage(sockets_map),
                Feature::SocketDestroy => socket_destroy(),
                Feature::SocketRelease => socket_release(ebpf),
                Feature::CookieProof => unreachable!("decided above"),
            };
            match result {
                Ok(()) => Probe::enabled(feature),
                Err(e) => Probe::refused(feature, e.errno(), &e),
            }
        };
        if probe.state != super::features::State::Enabled
            && let Some(dir) = pins
        {
            let pin = match feature {
                Feature::SocketsIterator => Some(ITER_PIN),
                Feature::UdpIterator => Some(UDP_ITER_PIN),
                _ => None,
            };
            if let Some(pin) = pin {
                let _ = std::fs::remove_file(dir.join(pin));
            }
        }
        probes.push(probe);
    }
    Features::new(probes)
}

/// Loads the storage-map iterator and links it over `SOCKETS`.
fn sockets_iterator(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    sockets_map: BorrowedFd<'_>,
    pins: Option<&Path>,
) -> Result<(), ProbeError> {
    iterator(
        ebpf,
        btf,
        program::SOCKETS_ITER,
        "bpf_sk_storage_map",
        Some(sockets_map),
        pins.map(|d| d.join(ITER_PIN)),
    )
}

/// Loads the UDP iterator and links it.
fn udp_iterator(ebpf: &mut Ebpf, btf: &aya::Btf, pins: Option<&Path>) -> Result<(), ProbeError> {
    iterator(
        ebpf,
        btf,
        program::UDP_ITER,
        "udp",
        None,
        pins.map(|d| d.join(UDP_ITER_PIN)),
    )
}

/// Loads iterator program `name` for `target`, links it (over `map` for a map iterator), runs
/// one walk to see the kernel accept the whole chain, and pins the link at `pin`.
fn iterator(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    name: &'static str,
    target: &str,
    map: Option<BorrowedFd<'_>>,
    pin_at: Option<std::path::PathBuf>,
) -> Result<(), ProbeError> {
    let Some(Program::Iter(iter)) = ebpf.program_mut(name) else {
        return Err(ProbeError::Missing { program: name });
    };
    if iter.fd().is_err() {
        iter.load(target, btf)
            .map_err(|e| ProbeError::from_program(name, e))?;
    }
    let prog = iter.fd().map_err(|source| ProbeError::Program {
        program: name,
        source,
    })?;
    let link_err = |source| ProbeError::Link {
        program: name,
        source,
    };
    let link = sys::iter_link(prog.as_fd(), map).map_err(link_err)?;
    sys::iter_create(link.as_fd()).map_err(link_err)?;
    if let Some(path) = pin_at {
        pin(link.as_fd(), &path)?;
    }
    Ok(())
}

/// Replaces the pin at `path` with `fd`.
fn pin(fd: BorrowedFd<'_>, path: &Path) -> Result<(), ProbeError> {
    let _ = std::fs::remove_file(path);
    sys::obj_pin(fd, path).map_err(|source| ProbeError::Pin {
        path: path.to_path_buf(),
        source,
    })?;
    super::pins::restrict(path, 0o600);
    Ok(())
}

/// Loads (verifies) the release program; the agent attaches it after its first sync.
fn socket_release(ebpf: &mut Ebpf) -> Result<(), ProbeError> {
    let name = program::RELEASE;
    let Some(Program::CgroupSock(prog)) = ebpf.program_mut(name) else {
        return Err(ProbeError::Missing { program: name });
    };
    if prog.fd().is_err() {
        prog.load().map_err(|e| ProbeError::from_program(name, e))?;
    }
    Ok(())
}

/// A TCP dump of the current namespace asking for `SOCKETS` values.
fn sock_diag_storage(sockets_map: BorrowedFd<'_>) -> Result<(), ProbeError> {
    sock_diag::dump(
        sock_diag::IPPROTO_TCP,
        sock_diag::AF_INET,
        sock_diag::state_bit(sock_diag::TCP_ESTABLISHED),
        &[sockets_map],
    )
    .map(drop)
    .map_err(ProbeError::SockDiag)
}

/// Destroys a UDP socket of the probe's own, connected to another on loopback (a UDP connect
/// sends nothing).
fn socket_destroy() -> Result<(), ProbeError> {
    let server = UdpSocket::bind("127.0.0.1:0").map_err(ProbeError::Socket)?;
    let client = UdpSocket::bind("127.0.0.1:0").map_err(ProbeError::Socket)?;
    client
        .connect(server.local_addr().map_err(ProbeError::Socket)?)
        .map_err(ProbeError::Socket)?;
    let cookie =
        rustix::net::sockopt::socket_cookie(&client).map_err(|e| ProbeError::Socket(e.into()))?;
    let sockets = sock_diag::dump(
        sock_diag::IPPROTO_UDP,
        sock_diag::AF_INET,
        sock_diag::state_bit(sock_diag::TCP_ESTABLISHED),
        &[],
    )
    .map_err(ProbeError::SockDiag)?;
    let socket = sockets
        .iter()
        .find(|s| s.cookie == cookie)
        .ok_or(ProbeError::NotDestroyed)?;
    match sock_diag::destroy(socket) {
        Ok(true) => Ok(()),
        Ok(false) => Err(ProbeError::NotDestroyed),
        Err(e) => Err(ProbeError::SockDiag(e)),
    }
}

/// Splits aya's error for a program load: the kernel refused it (the verifier's log and the
/// errno), or something else failed (returned as is).
pub(crate) fn kernel_refusal(
    e: aya::programs::ProgramError,
) -> Result<(String, io::Error), aya::programs::ProgramError> {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => Ok((verifier_log.to_string(), io_error)),
        other => Err(other),
    }
}
