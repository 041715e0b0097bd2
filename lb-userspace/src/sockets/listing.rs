//! The sockets socklb translated, as the kernel holds them now: each one's record (where it
//! was translated, for which client, since when) and, where asked, the kernel's own view of it
//! (TCP state, connected or not, its network namespace).
//!
//! A connect's record (a TCP connection, or a connected UDP socket) lives in its `CONNECTIONS`
//! slot (read in place, by cookie) unless the slot was taken; every other record in the
//! socket's own storage (`SOCKETS`), read in one of two ways, whichever the kernel allowed at
//! start (see `features`):
//! - in one walk over the storage map (`SOCKETS_ITER`, an iterator over map elements), or
//! - one pod network namespace at a time: TCP sockets through `sock_diag` with the storage
//!   attribute, UDP sockets through `UDP_SOCKETS_ITER` (an iterator over the namespace's UDP
//!   sockets that reads each one's storage and addresses). `sock_diag` reports storage for TCP
//!   sockets only.
//!
//! The kernel's view comes one network namespace at a time (the namespaces of the processes in
//! the attached cgroup tree, entered with `setns()` on a thread of the walk's own): from the UDP
//! iterator for IPv4 UDP sockets, from `sock_diag` for the others. A namespace that cannot be
//! read is reported and the walk goes on.
//!
//! The slots are read in place (`Slots`, mapped read-only): the kernel maps every page of an
//! array at `mmap`, which counts in the RSS, so a scan maps windows of 576 KiB one after the
//! other. `census_each` streams every record with the kernel's view where asked: an IPv4 UDP
//! socket's addresses come from the UDP iterator itself (the start of `struct sock_common`,
//! checked by the verifier against the kernel's BTF), so a namespace's UDP sockets cost one
//! iterator walk and no dump. Dumps ask only for the states a socket with a record can be in
//! (`sock_diag::RECORD_STATES`), and both TCP families in one dump where the kernel takes the
//! older request.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    io::{self, Read as _},
    net::{Ipv4Addr, SocketAddr},
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

use lb_common::{ConnRecord, MapId, SockAddrs, SockRecord, SockState, SocketEntry, UdpSocketEntry};

pub use crate::dataplane::sys::record_clock_now;
use crate::{
    dataplane::{
        features::Listing,
        pins::{ITER_PIN, SocketPins, UDP_ITER_PIN},
        sock_diag, sys,
    },
    vocab::Protocol,
};

/// Why a listing failed as a whole (one namespace failing does not fail it).
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("reading the sockets iterator {}", .path.display())]
    Iterator {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("walking the cgroup tree at {}", .path.display())]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("opening the socket map {}", .path.display())]
    Map {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the namespace walk's thread panicked")]
    Panicked,
}

/// Why one network namespace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("entering the network namespace {}", .path.display())]
    Enter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listing sockets in {}", .path.display())]
    Dump {
        path: PathBuf,
        #[source]
        source: sock_diag::SockDiagError,
    },
    #[error("running the UDP iterator in {}", .path.display())]
    UdpIterator {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl NamespaceError {
    /// The namespace went away meanwhile (its last process exited): nothing to report.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Enter { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl SocketPins {
    /// Every socket with a record, in one walk (`SOCKETS_ITER`), handed to `each` as it is
    /// read (nothing is collected here: the walk costs a buffer, whatever the socket count).
    pub fn for_each_global(&self, each: impl FnMut(&SocketEntry)) -> Result<(), ListError> {
        let path = self.dir.join(ITER_PIN);
        let err = |source| ListError::Iterator {
            path: path.clone(),
            source,
        };
        let link = sys::obj_get(&path, false).map_err(err)?;
        let file = sys::iter_create(link.as_fd()).map_err(err)?;
        for_each_entry(file, each).map_err(err)
    }

    pub(super) fn sockets_map(&self) -> Result<OwnedFd, ListError> {
        let path = self.dir.join(lb_common::MapId::Sockets.name());
        sys::obj_get(&path, false).map_err(|source| ListError::Map { path, source })
    }

    pub(super) fn udp_iter(&self) -> Result<OwnedFd, ListError> {
        let path = self.dir.join(UDP_ITER_PIN);
        sys::obj_get(&path, false).map_err(|source| ListError::Iterator { path, source })
    }
}

/// Decodes an iterator's output as it reads it: one entry (`SocketEntry` or `UdpSocketEntry`)
/// after another, through a buffer of a few hundred entries.
pub(super) fn for_each_entry<E: IterEntry>(
    mut file: std::fs::File,
    mut each: impl FnMut(&E),
) -> io::Result<()> {
    let entry_size = size_of::<E>();
    let mut buf = vec![0u8; entry_size * 256];
    let mut filled = 0;
    loop {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
        let whole = filled - filled % entry_size;
        for chunk in buf[..whole].chunks_exact(entry_size) {
            // SAFETY: `IterEntry` types are plain old data (repr(C), integers only, no padding,
            // asserted in lb-common) and the chunk holds exactly one's size.
            each(&unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<E>()) });
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
    }
}

/// What an iterator writes per socket: plain old data, any bit pattern valid.
pub(super) trait IterEntry: Copy {}
impl IterEntry for SocketEntry {}
impl IterEntry for UdpSocketEntry {}

/// The records a socket's state holds (the used ones, in slot order).
pub fn records(state: &SockState) -> impl Iterator<Item = &SockRecord> {
    state.records.iter().filter(|r| r.frontend.family != 0)
}

/// A socket's protocol, from its records (all of one socket's records share it).
pub fn protocol_of(state: &SockState) -> Option<Protocol> {
    records(state)
        .next()
        .and_then(|r| crate::dataplane::abi::protocol_from(r.frontend.protocol))
}

/// One pod network namespace: a `/proc/PID/ns/net` of a process in the cgroup tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub path: PathBuf,
    /// The namespace's inode number (`ip netns identify`, `lsns` show it).
    pub inode: u64,
}

/// One network namespace per (device, inode) used by processes of `root`'s cgroup tree. A
/// cgroup removed while the tree is walked (a pod going away) is skipped; only `root` itself
/// must be readable.
pub fn namespaces(root: &Path) -> Result<Vec<Namespace>, ListError> {
    let mut netns: BTreeMap<(u64, u64), PathBuf> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut seen = BTreeSet::new();
    while let Some(dir) = stack.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(meta) = std::fs::metadata(&path) {
                netns.entry((meta.dev(), meta.ino())).or_insert(path);
            }
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir != root => continue,
            Err(source) => {
                return Err(ListError::Cgroup {
                    path: dir.clone(),
                    source,
                });
            }
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    Ok(netns
        .into_iter()
        .map(|((_, inode), path)| Namespace { path, inode })
        .collect())
}

/// Each namespace walked, with what was done there.
pub type Walked<T> = Vec<(Namespace, Result<T, NamespaceError>)>;

/// Runs `each` inside every namespace in turn, on a thread of its own (`setns()` changes only
/// the calling thread's namespace). Returns each namespace's result; one that could not be
/// entered gives `NamespaceError::Enter`.
pub fn in_each_namespace<T: Send>(
    namespaces: &[Namespace],
    mut each: impl FnMut(&Namespace) -> Result<T, NamespaceError> + Send,
) -> Result<Walked<T>, ListError> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                namespaces
                    .iter()
                    .map(|ns| {
                        let result = enter(ns).and_then(|()| each(ns));
                        (ns.clone(), result)
                    })
                    .collect()
            })
            .join()
            .map_err(|_| ListError::Panicked)
    })
}

fn enter(ns: &Namespace) -> Result<(), NamespaceError> {
    let enter = || -> io::Result<()> {
        let file = std::fs::File::open(&ns.path)?;
        rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        Ok(())
    };
    enter().map_err(|source| NamespaceError::Enter {
        path: ns.path.clone(),
        source,
    })
}

/// The `CONNECTIONS` slots (TCP connections recorded without socket storage), mapped
/// read-only. The kernel maps every page of an array map at `mmap` (`remap_vmalloc_range`),
/// so a mapping of the whole array adds all of its 9 MiB to the process's RSS at once, read
/// or not: the whole array is mapped only at the first lookup by cookie, and a scan maps one
/// window at a time.
pub(crate) struct Slots {
    fd: OwnedFd,
    path: PathBuf,
    /// The whole array, for lookups by cookie; `None` inside if it could not be mapped.
    all: std::sync::OnceLock<Option<sys::MappedArray<ConnRecord>>>,
}

/// Slots read per window by [`Slots::each`] (576 KiB: a whole number of pages).
const SLOT_WINDOW: usize = 8192;
/// Slots in the array.
const SLOT_COUNT: usize = lb_common::CONNECTION_SLOTS as usize;

impl Slots {
    /// Opens the pinned `CONNECTIONS` array (absent: `None`, an agent older than the slots).
    pub(crate) fn open(pins: &SocketPins) -> Result<Option<Self>, ListError> {
        let path = pins.dir.join(MapId::Connections.name());
        if !path.exists() {
            return Ok(None);
        }
        // The kernel maps an array only through a descriptor opened for writing, though the
        // mapping itself is read-only.
        let fd = sys::obj_get(&path, false).map_err(|source| ListError::Map {
            path: path.clone(),
            source,
        })?;
        Ok(Some(Self {
            fd,
            path,
            all: std::sync::OnceLock::new(),
        }))
    }

    /// The record of the connection with this cookie, if it holds its slot.
    pub(crate) fn get(&self, cookie: u64) -> Option<SockState> {
        let all = self.all.get_or_init(|| {
            sys::MappedArray::map(self.fd.as_fd(), SLOT_COUNT)
                .inspect_err(|e| {
                    tracing::warn!(
                        map = %self.path.display(),
                        error = e as &dyn std::error::Error,
                        "could not map the connection slots: connections in them are listed without their record"
                    );
                })
                .ok()
        });
        let slot = all
            .as_ref()?
            .get((cookie & u64::from(SLOT_MASK)) as usize)?;
        (cookie != 0 && slot.cookie == cookie).then(|| state_of(&slot))
    }

    /// Every held slot: (cookie, record). Read one window at a time, each unmapped before the
    /// next (a whole mapping made the agent's RSS 9 MiB larger each time the metrics counted
    /// the slots).
    pub(crate) fn each(&self, mut f: impl FnMut(u64, SockState)) -> Result<(), ListError> {
        let len = SLOT_COUNT;
        for first in (0..len).step_by(SLOT_WINDOW) {
            let window = sys::MappedArray::<ConnRecord>::map_at(
                self.fd.as_fd(),
                first,
                SLOT_WINDOW.min(len - first),
            )
            .map_err(|source| ListError::Map {
                path: self.path.clone(),
                source,
            })?;
            for i in 0..window.len() {
                if let Some(slot) = window.get(i)
                    && slot.cookie != 0
                {
                    f(slot.cookie, state_of(&slot));
                }
            }
        }
        Ok(())
    }
}

const SLOT_MASK: u32 = lb_common::CONNECTION_SLOTS - 1;

/// How many `CONNECTIONS` slots are held now (0 where there is no such map).
pub fn held_slots(pins: &SocketPins) -> Result<usize, ListError> {
    let mut held = 0;
    if let Some(slots) = Slots::open(pins)? {
        slots.each(|_, _| held += 1)?;
    }
    Ok(held)
}

/// The TCP connections' slots held by a socket made before `since` (`CLOCK_MONOTONIC_COARSE`
/// ns, the records' clock): the slots a census should find a socket for. Its size is bounded by
/// the slots, not by the sockets.
pub fn tcp_slots_before(pins: &SocketPins, since: u64) -> Result<HashSet<u64>, ListError> {
    let mut held = HashSet::new();
    if let Some(slots) = Slots::open(pins)? {
        slots.each(|cookie, state| {
            if state.created_ns < since && protocol_of(&state) == Some(Protocol::Tcp) {
                held.insert(cookie);
            }
        })?;
    }
    Ok(held)
}

/// Frees the slots of these cookies where they still hold them: slots whose TCP socket is
/// gone without the release program seeing it close (a multipath TCP connection's first
/// subflow, which the kernel closes without a release). A cookie is never given to another
/// socket, and no program takes a slot another cookie holds, so a slot still holding one of
/// these is written by no one else. Returns how many were freed.
pub fn free_slots<S: std::hash::BuildHasher>(
    pins: &SocketPins,
    cookies: &HashSet<u64, S>,
) -> Result<usize, ListError> {
    if cookies.is_empty() {
        return Ok(0);
    }
    let path = pins.dir.join(MapId::Connections.name());
    let err = |source: std::io::Error| ListError::Map {
        path: path.clone(),
        source,
    };
    let data = aya::maps::MapData::from_pin(&path).map_err(|e| err(std::io::Error::other(e)))?;
    let mut array: aya::maps::Array<_, ConnRecord> = aya::maps::Map::from_map_data(data)
        .and_then(aya::maps::Array::try_from)
        .map_err(|e| err(std::io::Error::other(e)))?;
    let mut freed = 0;
    for &cookie in cookies {
        let index = (cookie & u64::from(SLOT_MASK)) as u32;
        let held = array
            .get(&index, 0)
            .map_err(|e| err(std::io::Error::other(e)))?;
        if held.cookie == cookie {
            array
                .set(index, ConnRecord::default(), 0)
                .map_err(|e| err(std::io::Error::other(e)))?;
            freed += 1;
        }
    }
    Ok(freed)
}

/// A slot's record as a socket's state with one destination.
fn state_of(slot: &ConnRecord) -> SockState {
    let mut state = SockState {
        cgroup_id: slot.cgroup_id,
        created_ns: slot.created_ns,
        ..SockState::default()
    };
    state.records[0] = SockRecord {
        frontend: slot.frontend,
        backend: slot.backend,
        service_id: slot.service_id,
        slot: slot.slot,
    };
    state
}

/// A socket with a record, or `None` when the kernel restarted the dump (see `Records::here`).
pub(crate) type Found<'a> = Option<(&'a sock_diag::DiagSocket, SockState)>;

/// Where records come from during a namespace walk, given what the kernel allowed.
pub(crate) struct Records {
    /// Every storage record, read in one walk, by cookie: only where a protocol has no
    /// per-namespace way (its memory grows with all the records).
    global: Option<HashMap<u64, SockState>>,
    /// `SOCKETS`, for `sock_diag`'s storage attribute (TCP, per namespace).
    sockets_map: Option<OwnedFd>,
    /// The UDP iterator (UDP records, per namespace).
    udp_iter: Option<OwnedFd>,
    slots: Option<Slots>,
}

impl Records {
    /// Opens what `listing` allows: each protocol per namespace where it can be (memory bound
    /// by one namespace's sockets), else from one global walk.
    pub(crate) fn open(pins: &SocketPins, listing: Listing) -> Result<Self, ListError> {
        let sockets_map = if listing.tcp_per_namespace {
            Some(pins.sockets_map()?)
        } else {
            None
        };
        let udp_iter = if listing.udp_per_namespace {
            Some(pins.udp_iter()?)
        } else {
            None
        };
        let global = if listing.global && (sockets_map.is_none() || udp_iter.is_none()) {
            let mut map = HashMap::new();
            pins.for_each_global(|e| {
                map.insert(e.cookie, e.state);
            })?;
            Some(map)
        } else {
            None
        };
        Ok(Self {
            global,
            sockets_map,
            udp_iter,
            slots: Slots::open(pins)?,
        })
    }

    /// Inside a namespace: its sockets of `protocol` in the `states` mask that have a record
    /// (sockets socklb did not translate are left out), each handed to `each` as the dump
    /// reads it; `None` when the kernel restarted the dump (forget this namespace's sockets of
    /// this protocol so far).
    pub(crate) fn here(
        &self,
        ns: &Namespace,
        protocol: Protocol,
        states: u32,
        each: &mut dyn FnMut(Found<'_>),
    ) -> Result<(), NamespaceError> {
        self.here_where(ns, protocol, states, &|_, _| true, each)
    }

    /// [`Self::here`], where the UDP iterator runs: only UDP sockets whose record `keep`s
    /// (given the peer where the iterator read it: an IPv4 socket's) are looked up in the dump,
    /// and none is dumped when the iterator kept none.
    pub(crate) fn here_where(
        &self,
        ns: &Namespace,
        protocol: Protocol,
        states: u32,
        keep: &dyn Fn(&SockState, Option<SocketAddr>) -> bool,
        each: &mut dyn FnMut(Found<'_>),
    ) -> Result<(), NamespaceError> {
        let dump_err = |source| NamespaceError::Dump {
            path: ns.path.clone(),
            source,
        };
        let number = match protocol {
            Protocol::Tcp => sock_diag::IPPROTO_TCP,
            Protocol::Udp => sock_diag::IPPROTO_UDP,
        };
        let storage_maps: Vec<_> = match (&self.sockets_map, protocol) {
            (Some(map), Protocol::Tcp) => vec![map.as_fd()],
            _ => Vec::new(),
        };
        let udp_records = match (&self.udp_iter, protocol) {
            (Some(link), Protocol::Udp) => {
                Some(udp_records(link, states, keep).map_err(|source| {
                    NamespaceError::UdpIterator {
                        path: ns.path.clone(),
                        source,
                    }
                })?)
            }
            _ => None,
        };
        if udp_records.as_ref().is_some_and(HashMap::is_empty) {
            // No UDP socket of these states here has a record worth a look.
            return Ok(());
        }
        let record = |socket: &sock_diag::DiagSocket| -> Option<SockState> {
            let found = match protocol {
                Protocol::Tcp => socket
                    .storages
                    .first()
                    .and_then(|s| state_from(&s.value))
                    .or_else(|| self.slots.as_ref().and_then(|s| s.get(socket.cookie))),
                Protocol::Udp => udp_records
                    .as_ref()
                    .and_then(|m| m.get(&socket.cookie).copied()),
            };
            found
                .or_else(|| {
                    self.global
                        .as_ref()
                        .and_then(|m| m.get(&socket.cookie).copied())
                })
                .or_else(|| {
                    // A connected UDP socket's slot (the UDP iterator reports those itself).
                    (protocol == Protocol::Udp && udp_records.is_none() && socket.dst().port() != 0)
                        .then(|| self.slots.as_ref().and_then(|s| s.get(socket.cookie)))
                        .flatten()
                })
        };
        // TCP: both families in one walk of the node's TCP table (shared by every namespace,
        // so each walk visits every TCP socket of the node, waiting ones included).
        let families: &[u8] = match protocol {
            Protocol::Tcp => &[sock_diag::BOTH_FAMILIES],
            Protocol::Udp => &[sock_diag::AF_INET, sock_diag::AF_INET6],
        };
        for &family in families {
            sock_diag::dump_each(
                number,
                family,
                states,
                &storage_maps,
                &mut |event| match event {
                    sock_diag::Dumped::Socket(socket) => {
                        if let Some(state) = record(socket) {
                            each(Some((socket, state)));
                        }
                    }
                    sock_diag::Dumped::Restart => each(None),
                },
            )
            .map_err(dump_err)?;
        }
        Ok(())
    }

    /// Inside a namespace: its sockets of `protocol` that have a record, each with the
    /// kernel's view, handed to `each` as they are read; `None` as in [`Self::here`]. UDP
    /// sockets through the UDP iterator, which reads an IPv4 socket's addresses itself: no
    /// `sock_diag` dump unless the namespace has an IPv6 UDP socket with a record.
    fn live_here(
        &self,
        ns: &Namespace,
        protocol: Protocol,
        each: &mut dyn FnMut(Option<LiveSocket>),
    ) -> Result<(), NamespaceError> {
        let Some(link) = self.udp_iter.as_ref().filter(|_| protocol == Protocol::Udp) else {
            return self.here(ns, protocol, sock_diag::RECORD_STATES, &mut |found| {
                each(found.map(|(socket, state)| LiveSocket {
                    cookie: socket.cookie,
                    protocol,
                    state,
                    kernel: Some(KernelView::of(socket, ns)),
                }));
            });
        };
        let iter_err = |source| NamespaceError::UdpIterator {
            path: ns.path.clone(),
            source,
        };
        let file = sys::iter_create(link.as_fd()).map_err(iter_err)?;
        let mut ipv6: HashMap<u64, SockState> = HashMap::new();
        for_each_entry(file, |e: &UdpSocketEntry| {
            match ipv4_view(&e.addrs, ns.inode) {
                Some(view) => each(Some(LiveSocket {
                    cookie: e.cookie,
                    protocol,
                    state: e.state,
                    kernel: Some(view),
                })),
                None => {
                    ipv6.insert(e.cookie, e.state);
                }
            }
        })
        .map_err(iter_err)?;
        if ipv6.is_empty() {
            return Ok(());
        }
        sock_diag::dump_each(
            sock_diag::IPPROTO_UDP,
            sock_diag::AF_INET6,
            sock_diag::RECORD_STATES,
            &[],
            &mut |event| match event {
                sock_diag::Dumped::Socket(socket) => {
                    if let Some(state) = ipv6.get(&socket.cookie) {
                        each(Some(LiveSocket {
                            cookie: socket.cookie,
                            protocol,
                            state: *state,
                            kernel: Some(KernelView::of(socket, ns)),
                        }));
                    }
                }
                // Only the IPv6 sockets restart: their IPv4 neighbours were already handed on
                // and a view is a snapshot anyway.
                sock_diag::Dumped::Restart => {}
            },
        )
        .map_err(|source| NamespaceError::Dump {
            path: ns.path.clone(),
            source,
        })
    }
}

/// The UDP iterator's records in the calling thread's network namespace, by cookie: of the
/// sockets in the `states` mask whose record `keep`s (with its peer, for an IPv4 socket).
fn udp_records(
    link: &OwnedFd,
    states: u32,
    keep: &dyn Fn(&SockState, Option<SocketAddr>) -> bool,
) -> io::Result<HashMap<u64, SockState>> {
    let file = sys::iter_create(link.as_fd())?;
    let mut map = HashMap::new();
    for_each_entry(file, |e: &UdpSocketEntry| {
        if sock_diag::state_bit(e.addrs.tcp_state) & states != 0
            && keep(&e.state, ipv4_view(&e.addrs, 0).map(|v| v.peer))
        {
            map.insert(e.cookie, e.state);
        }
    })?;
    Ok(map)
}

/// An IPv4 socket's view from the addresses the UDP iterator read; `None` for another family
/// (an IPv6 socket's addresses are not in `SockAddrs`).
fn ipv4_view(addrs: &SockAddrs, netns: u64) -> Option<KernelView> {
    (addrs.family == u16::from(sock_diag::AF_INET)).then(|| KernelView {
        state: addrs.tcp_state,
        local: SocketAddr::from((
            Ipv4Addr::from(addrs.local_addr.to_ne_bytes()),
            addrs.local_port,
        )),
        peer: SocketAddr::from((
            Ipv4Addr::from(addrs.peer_addr.to_ne_bytes()),
            u16::from_be(addrs.peer_port_be),
        )),
        netns,
    })
}

/// A `SOCKETS` value from `sock_diag`'s bytes.
pub(super) fn state_from(bytes: &[u8]) -> Option<SockState> {
    (bytes.len() >= size_of::<SockState>()).then(|| {
        // SAFETY: SockState is plain old data (asserted in lb-common) and `bytes` holds at least
        // its size.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<SockState>()) }
    })
}

/// What the kernel says of one translated socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelView {
    /// A TCP state number (`sock_diag`); a connected UDP socket is `TCP_ESTABLISHED`, an
    /// unconnected one `TCP_CLOSE`.
    pub state: u8,
    pub local: SocketAddr,
    /// The peer (unspecified for an unconnected UDP socket).
    pub peer: SocketAddr,
    /// The network namespace's inode.
    pub netns: u64,
}

impl KernelView {
    fn of(socket: &sock_diag::DiagSocket, ns: &Namespace) -> Self {
        Self {
            state: socket.state,
            local: socket.src(),
            peer: socket.dst(),
            netns: ns.inode,
        }
    }
}

/// One translated socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSocket {
    pub cookie: u64,
    pub protocol: Protocol,
    pub state: SockState,
    /// `None` when the socket was not found in any pod network namespace (a UDP socket
    /// terminated while its owner keeps the descriptor, say), or no kernel view was asked for.
    pub kernel: Option<KernelView>,
}

/// How a listing went (its sockets went to the caller one by one).
#[derive(Debug, Default)]
pub struct CensusStats {
    /// Namespaces walked (0 when records came from one walk and no kernel view was asked for).
    pub namespaces: usize,
    /// Namespaces that could not be read (the census went on without them).
    pub errors: Vec<NamespaceError>,
    /// How records were read.
    pub listing: Option<Listing>,
}

/// Every translated socket, and how the listing went.
#[derive(Debug, Default)]
pub struct Census {
    pub sockets: Vec<LiveSocket>,
    pub stats: CensusStats,
}

/// Lists every translated socket into memory (`census_each` streams them instead).
pub fn census(
    pins: &SocketPins,
    cgroup: &Path,
    listing: Listing,
    kernel_view: bool,
) -> Result<Census, ListError> {
    let mut sockets = Vec::new();
    let stats = census_each(pins, cgroup, listing, kernel_view, |s| sockets.push(s))?;
    Ok(Census { sockets, stats })
}

/// Hands every translated socket to `each` as it is found; the listing's memory does not grow
/// with the sockets (but for one namespace's UDP records, bounded by the per-pod bound). With
/// `kernel_view`, each namespace of `cgroup`'s tree is walked for the kernel's view; without it
/// and with a global iterator, only the records are read (the cheap path for counts).
pub fn census_each(
    pins: &SocketPins,
    cgroup: &Path,
    listing: Listing,
    kernel_view: bool,
    mut each: impl FnMut(LiveSocket),
) -> Result<CensusStats, ListError> {
    let mut stats = CensusStats {
        listing: Some(listing),
        ..CensusStats::default()
    };
    if listing.global && !kernel_view {
        pins.for_each_global(|e| {
            if let Some(protocol) = protocol_of(&e.state) {
                each(LiveSocket {
                    cookie: e.cookie,
                    protocol,
                    state: e.state,
                    kernel: None,
                });
            }
        })?;
        if let Some(slots) = Slots::open(pins)? {
            slots.each(|cookie, state| {
                if let Some(protocol) = protocol_of(&state) {
                    each(LiveSocket {
                        cookie,
                        protocol,
                        state,
                        kernel: None,
                    });
                }
            })?;
        }
        return Ok(stats);
    }
    let records = Records::open(pins, listing)?;
    let namespaces = namespaces(cgroup)?;
    // The walk runs on a thread of its own (it enters each namespace); what it finds comes
    // back through a short queue, so neither side holds more than a few sockets.
    let (tx, rx) = std::sync::mpsc::sync_channel::<LiveSocket>(1024);
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    let global_left = records.global.is_some();
    let walked = std::thread::scope(|scope| {
        let walker = scope.spawn(|| {
            let tx = tx;
            in_each_namespace(&namespaces, |ns| {
                for protocol in [Protocol::Tcp, Protocol::Udp] {
                    // An interrupted dump may show a socket twice: a view is a snapshot anyway.
                    records.live_here(ns, protocol, &mut |found| {
                        if let Some(socket) = found {
                            let _ = tx.send(socket);
                        }
                    })?;
                }
                Ok(())
            })
        });
        for socket in rx {
            if global_left {
                seen.insert(socket.cookie);
            }
            each(socket);
        }
        walker.join().map_err(|_| ListError::Panicked)
    })??;
    for (_, result) in walked {
        match result {
            Ok(()) => stats.namespaces += 1,
            Err(e) if e.is_gone() => {}
            Err(e) => stats.errors.push(e),
        }
    }
    if let Some(map) = &records.global {
        // Records no namespace showed: sockets that carry no traffic (see `LiveSocket::kernel`).
        for (cookie, state) in map {
            if !seen.contains(cookie)
                && let Some(protocol) = protocol_of(state)
            {
                each(LiveSocket {
                    cookie: *cookie,
                    protocol,
                    state: *state,
                    kernel: None,
                });
            }
        }
    }
    Ok(stats)
}
