//! Loading the programs, pinning maps and links, adopting what a previous agent pinned,
//! migrating from an older map layout, and removing it all again. Where each pin lives is
//! `pins`' business (see there for the folder's layout).
//!
//! The pins keep the programs attached and the maps alive while no agent runs, so services keep
//! working. A starting agent takes an exclusive lock on the pin folder (a second agent refuses
//! to start, naming the holder's pid), loads its programs against its generation's maps, and
//! attaches them only once the first complete sync has filled those maps: until then the
//! previous programs keep serving. Attaching is make-before-break (cgroup links run side by side;
//! the pin then moves to the new link), after which links of programs this agent does not have,
//! and other generations' maps, are removed.
//!
//! The core (`program::ALL`, the eight cgroup programs, and the maps) loads or `Dataplane::load`
//! fails with a typed `LoadError`: a program the kernel refuses keeps the kernel's errno as its
//! source and the verifier's last lines in its message, a map the kernel will not create is named
//! (`MapCreate`), and the permission hint comes from the process's own effective capabilities
//! (and lockdown mode), never from error text. A start that fails removes the map folders it
//! created. The optional parts are then tried (`probe`); `probe_kernel` tries them on throwaway
//! maps for `socklb version --features`.
//!
//! `attach` attaches the core and, when the kernel took it, the release program, and only then
//! writes `CONFIG`: a record counted or a slot taken before the release program runs would never
//! be given back. A new generation holds `DatapathConfig::default()` (no bound, no slots) until
//! then, and starts with the backend port bitmap of the generations before it
//! (`carry_backend_ports`): getpeername and recvmsg look for a record only on ports in that
//! bitmap, which only grows. The bound and the slots are on only with the release program
//! (`socket-release`); the slots also need TCP records (`--tcp-peer-name`). `refresh_pods`
//! rewrites the pods' level and tiers in `CONFIG` when they change.
use std::{
    collections::BTreeSet,
    fs, io,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::{DirBuilderExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{CgroupAttachMode, Program, links::FdLink, links::PinnedLink},
};
use lb_common::{CONFIG_CONNECTION_SLOTS, DatapathConfig, MapDescriptor, MapId, MapKind, program};

use super::{
    bpf::BpfServiceMaps,
    features::{Feature, Features},
    maps::{Capacities, MapReadError},
    pins::{PinFolder, SocketPins, layout_digest, restrict, socket_layout_digest},
    pods::{self, PodCgroups},
    probe::{self, kernel_refusal},
    proof, sys, sysfs,
};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"));

/// What the pin folder was asked to do when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinOp {
    Create,
    Open,
    Lock,
    Mount,
    Remove,
    Move,
}

impl std::fmt::Display for PinOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Create => "creating",
            Self::Open => "opening",
            Self::Lock => "locking",
            Self::Mount => "mounting bpffs on",
            Self::Remove => "removing",
            Self::Move => "moving a pin to",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("copying the eBPF object into memory of its own")]
    ObjectCopy(#[source] io::Error),
    #[error(
        "the embedded eBPF object lacks a cookie-proof sequence to write (lb_common::proof::RELEASE or ADDR; a build that lost one)"
    )]
    NoProofMarker,
    #[error("{op} {}", .path.display())]
    PinFolder {
        path: PathBuf,
        op: PinOp,
        #[source]
        source: io::Error,
    },
    #[error("pin folder {}: not on a bpf filesystem; mount one (mount -t bpf bpf DIR) or use the default /sys/fs/bpf/socklb", .path.display())]
    NotBpffs { path: PathBuf },
    #[error("another socklb agent{} is using the pin folder {}; stop it first (a second agent would hand out ids next to the first)", .holder.map(|p| format!(" (pid {p})")).unwrap_or_default(), .path.display())]
    Busy { path: PathBuf, holder: Option<u32> },
    #[error("--cgroup {}: not a cgroup v2 directory (socklb needs cgroup v2; see /proc/self/mountinfo for its mount)", .path.display())]
    NotCgroup2 { path: PathBuf },
    #[error("--cgroup {}", .path.display())]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("pinned map {} does not have the layout this socklb expects ({detail}); `socklb reset --bpffs {}` removes the old state", .map.name(), .folder.display())]
    IncompatiblePin {
        map: MapId,
        detail: String,
        folder: PathBuf,
    },
    #[error("pinned map {}", .path.display())]
    PinnedMap {
        path: PathBuf,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("loading the eBPF object (creating its maps){}", capability_hint())]
    Object {
        #[source]
        source: aya::EbpfError,
    },
    /// The kernel refused to create a map: its errno is the source.
    #[error("creating map {name}{}", capability_hint())]
    MapCreate {
        name: String,
        #[source]
        source: io::Error,
    },
    /// The kernel refused a core program: its errno is the source, the verifier's output is in
    /// the message (once).
    #[error("the kernel refused program {program}, which translation needs{}{}", capability_hint(), probe::verifier_tail(.verifier_log))]
    Refused {
        program: &'static str,
        verifier_log: String,
        #[source]
        source: io::Error,
    },
    #[error("program {program}: {what}")]
    Program {
        program: &'static str,
        what: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("program {program}: its link")]
    Link {
        program: &'static str,
        #[source]
        source: aya::programs::links::LinkError,
    },
    #[error("program {program}: pinning its link at {}", .path.display())]
    PinLink {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("writing the data path's settings (CONFIG)")]
    Config(#[source] aya::maps::MapError),
    #[error("program {program}: missing from the eBPF object")]
    MissingProgram { program: &'static str },
    #[error("map {}: missing from the eBPF object", .map.name())]
    MissingMap { map: MapId },
    #[error("map {}: duplicating its descriptor", .map.name())]
    MapFd {
        map: MapId,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Maps(#[from] MapReadError),
    #[error("carrying the programs' state into the grown maps")]
    Carry(#[source] aya::maps::MapError),
    #[error("marking the connection slots an older agent's programs may hold (SLOTS_HELD)")]
    SlotsHeld(#[source] aya::maps::MapError),
}

impl LoadError {
    /// An object load that failed: a map the kernel refused to create keeps its name and errno.
    fn object(e: aya::EbpfError) -> Self {
        match e {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error }) => {
                Self::MapCreate {
                    name,
                    source: io_error,
                }
            }
            source => Self::Object { source },
        }
    }

    fn refused(program: &'static str, e: aya::programs::ProgramError) -> Self {
        match kernel_refusal(e) {
            Ok((verifier_log, source)) => Self::Refused {
                program,
                verifier_log,
                source,
            },
            Err(source) => Self::Program {
                program,
                what: "loading it",
                source,
            },
        }
    }
}

/// The capabilities loading needs that this process lacks, read from its effective set (not
/// guessed from an error), and the kernel's lockdown mode when it is on: for messages.
pub fn capability_hint() -> String {
    use caps::{CapSet, Capability};
    let Ok(effective) = caps::read(None, CapSet::Effective) else {
        return String::new();
    };
    let mut missing: Vec<&str> = Vec::new();
    if !effective.contains(&Capability::CAP_BPF) && !effective.contains(&Capability::CAP_SYS_ADMIN)
    {
        missing.push("CAP_BPF");
    }
    if !effective.contains(&Capability::CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !effective.contains(&Capability::CAP_SYS_ADMIN) {
        missing.push("CAP_SYS_ADMIN");
    }
    let mut hint = String::new();
    if !missing.is_empty() {
        hint = format!(
            " (this process lacks {}: run socklb as root, or grant CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and CAP_SYS_ADMIN)",
            missing.join(", ")
        );
    }
    if let Some(mode) = sysfs::lockdown() {
        use std::fmt::Write as _;
        let _ = write!(hint, " (kernel lockdown: {mode})");
    }
    hint
}

/// What to load and where.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The pin folder, on a bpf filesystem.
    pub pin_folder: PathBuf,
    /// The cgroup v2 directory whose processes get socket-level load balancing.
    pub cgroup: PathBuf,
    pub capacities: Capacities,
    /// aya-log level in the programs: 0 = off (the logging code is removed by the verifier),
    /// 1 error .. 5 trace.
    pub log_level: u8,
    /// Give TCP sockets a record, so getpeername reports the service address.
    pub record_tcp: bool,
    /// Optional parts not to load (`--disable-feature`).
    pub disabled: BTreeSet<Feature>,
    /// Socket records one client cgroup may hold (`--max-sockets-per-pod`); `None`: no bound.
    pub max_sockets_per_pod: Option<u64>,
}

/// Takes over a record folder of another name (an older agent named it by other maps' layouts
/// too) whose `SOCKETS` map has this layout: the records of live sockets stay. Returns whether
/// one was taken over.
fn adopt_record_folder(pins: &PinFolder, sockets_dir: &Path) -> bool {
    if sockets_dir.exists() {
        return false;
    }
    let wanted = MapId::Sockets.descriptor();
    for dir in pins.socket_dirs() {
        let compatible = MapData::from_pin(dir.join(wanted.name))
            .ok()
            .and_then(|m| m.info().ok())
            .is_some_and(|i| {
                i.key_size() == wanted.key_size && i.value_size() == wanted.value_size
            });
        if compatible && fs::rename(&dir, sockets_dir).is_ok() {
            tracing::info!(from = %dir.display(), to = %sockets_dir.display(), "took over the socket records of an older agent");
            return true;
        }
    }
    false
}

/// Removes the pins of the per-socket maps beside the records whose layout is not this agent's
/// (they are made again, empty); the records themselves are never touched here.
fn replace_changed_socket_maps(sockets_dir: &Path) {
    for d in lb_common::MAPS
        .iter()
        .filter(|d| d.per_socket && d.id != MapId::Sockets)
    {
        let path = sockets_dir.join(d.name);
        let Ok(info) = MapData::from_pin(&path).and_then(|m| m.info()) else {
            continue;
        };
        if info.key_size() != d.key_size
            || info.value_size() != d.value_size
            || (sized(d) && info.max_entries() != d.default_capacity)
        {
            let _ = fs::remove_file(&path);
            tracing::info!(
                map = d.name,
                "replaced a per-socket map whose layout changed (made again, empty)"
            );
        }
    }
}

/// The exclusive lock on a pin folder, held for the agent's life.
pub struct PinLock {
    _fd: OwnedFd,
}

impl PinLock {
    /// Takes the lock, or says who holds it.
    pub fn take(root: &Path) -> Result<Self, LoadError> {
        let fd = rustix::fs::open(
            root,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| LoadError::PinFolder {
            path: root.to_path_buf(),
            op: PinOp::Open,
            source: e.into(),
        })?;
        match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Self { _fd: fd }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(LoadError::Busy {
                path: root.to_path_buf(),
                holder: lock_holder(root),
            }),
            Err(e) => Err(LoadError::PinFolder {
                path: root.to_path_buf(),
                op: PinOp::Lock,
                source: e.into(),
            }),
        }
    }
}

/// The pid holding a flock on `path`, from /proc/locks.
fn lock_holder(path: &Path) -> Option<u32> {
    let meta = fs::metadata(path).ok()?;
    let inode = meta.ino();
    let locks = fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:2f:5678 0 EOF"
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let ino = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
        (ino == inode)
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

/// The loaded programs and their maps. Dropping it keeps everything attached (the pins hold it).
pub struct Dataplane {
    pub ebpf: Ebpf,
    pub pins: PinFolder,
    /// This agent's map directory (its generation).
    pub maps_dir: PathBuf,
    /// The sizes of this generation's maps: the configured ones, or larger where the maps grew
    /// (an agent adopts a grown generation at start).
    pub capacities: Capacities,
    /// Where pods are in the cgroup tree, and how that was found.
    pub pods: PodCgroups,
    /// This agent's per-socket maps and iterator pins.
    pub sockets: SocketPins,
    /// The maps were there already (a restart of the same layout): they hold the last state.
    pub adopted: bool,
    /// What the kernel said about each optional part.
    pub features: Features,
    /// The settings the programs read, written once the programs are attached (the bound and
    /// the slots need the release program attached first).
    config: DatapathConfig,
    cgroup: PathBuf,
    _lock: PinLock,
}

/// A new, larger generation of maps with its programs loaded, not yet in use (see
/// `Dataplane::grow`).
pub struct Grown {
    ebpf: Ebpf,
    pub maps_dir: PathBuf,
    features: Features,
    pub capacities: Capacities,
}

impl Dataplane {
    /// Takes the pin folder's lock, creates or adopts this layout's maps, loads (verifies) the
    /// programs translation needs, and tries the optional parts. Nothing is attached yet: until
    /// `attach`, whatever was attached before keeps serving. A start that fails removes the map
    /// folders it created.
    pub fn load(config: &LoadConfig) -> Result<Self, LoadError> {
        let pins = PinFolder::new(&config.pin_folder);
        prepare_pin_folder(&pins)?;
        let lock = PinLock::take(&pins.root)?;
        if !sysfs::is_cgroup2(&config.cgroup) {
            return Err(LoadError::NotCgroup2 {
                path: config.cgroup.clone(),
            });
        }
        let (maps_dir, capacities) = generation_for(&pins, &config.capacities);
        let config = &LoadConfig {
            capacities,
            ..config.clone()
        };
        let sockets_dir = pins.sockets(&socket_layout_digest());
        adopt_record_folder(&pins, &sockets_dir);
        replace_changed_socket_maps(&sockets_dir);
        let adopted = maps_dir.join(MapId::Frontends4.name()).exists();
        let created: Vec<PathBuf> = [&maps_dir, &sockets_dir]
            .into_iter()
            .filter(|d| !d.exists())
            .cloned()
            .collect();
        let loaded = load_into(config, &maps_dir, &sockets_dir, &pins, adopted);
        let (ebpf, features) = match loaded {
            Ok(done) => done,
            Err(e) => {
                for dir in &created {
                    remove_dir_pins(dir);
                }
                return Err(e);
            }
        };
        let pods = pods::detect(&config.cgroup).unwrap_or_else(|e| {
            tracing::warn!(cgroup = %config.cgroup.display(), error = %e, "could not tell where pods are in the cgroup tree; each cgroup counts its own socket records");
            PodCgroups::default()
        });
        let release = features.enabled(Feature::SocketRelease);
        let settings = DatapathConfig {
            max_sockets_per_pod: config
                .max_sockets_per_pod
                .filter(|_| release)
                .unwrap_or(u64::MAX),
            tiers: pods.tiers,
            pod_level: pods.level,
            // The slots are on wherever the release program runs, whatever
            // `--tcp-peer-name` says (it only decides whether a TCP connect takes one): a
            // release program that skipped them would strand the slots connections took under
            // another setting.
            flags: if release { CONFIG_CONNECTION_SLOTS } else { 0 },
            // Keys the frontend index. An agent that adopts a generation keeps its secret, so
            // the index the last agent left serves on through the restart; it is rewritten
            // from FRONTENDS4 anyway (`service_maps`), whatever a crash left in it.
            index_secret: adopted
                .then(|| read_config(&ebpf).ok())
                .flatten()
                .map(|c| c.index_secret)
                .filter(|s| *s != 0)
                .unwrap_or_else(|| {
                    std::hash::BuildHasher::hash_one(
                        &std::hash::RandomState::new(),
                        std::process::id(),
                    )
                }),
        };
        Ok(Self {
            ebpf,
            pins,
            maps_dir,
            capacities,
            pods,
            sockets: SocketPins::new(sockets_dir),
            adopted,
            features,
            config: settings,
            cgroup: config.cgroup.clone(),
            _lock: lock,
        })
    }

    /// The programs attached, in attach order: the core, and the release program when the
    /// kernel took it.
    pub fn programs(&self) -> Vec<&'static str> {
        let mut names = program::ALL.to_vec();
        if self.features.enabled(Feature::SocketRelease) {
            names.push(program::RELEASE);
        }
        names
    }

    /// The settings the programs read (written by `attach`).
    pub fn config(&self) -> DatapathConfig {
        self.config
    }

    /// Looks again where pods are (the kubelet makes its quality-of-service tiers when it starts, maybe after
    /// the agent) and rewrites the settings when that changed. Call it only once attached.
    pub fn refresh_pods(&mut self) -> Result<bool, LoadError> {
        let Ok(pods) = pods::detect(&self.cgroup) else {
            return Ok(false);
        };
        if pods == self.pods {
            return Ok(false);
        }
        self.config.pod_level = pods.level;
        self.config.tiers = pods.tiers;
        self.pods = pods;
        write_config(&mut self.ebpf, self.config)?;
        Ok(true)
    }

    /// The service maps, writable (separate descriptors on the pinned maps).
    pub fn service_maps(&self) -> Result<BpfServiceMaps, MapReadError> {
        BpfServiceMaps::open_writer(&self.maps_dir, self.config.index_secret)
    }

    /// A new generation of maps sized `capacities` (larger: the maps grow), its programs
    /// loaded and verified, its maps empty, nothing attached: the caller fills it
    /// (`grown_maps`), then `switch`es to it, or `abandon`s it. The current generation keeps
    /// serving meanwhile. A generation of that size left by an earlier attempt is made again.
    pub fn grow(&self, config: &LoadConfig, capacities: Capacities) -> Result<Grown, LoadError> {
        let dir = self.pins.grown_generation(&layout_digest(&capacities));
        if dir != self.maps_dir {
            remove_dir_pins(&dir);
        }
        let config = LoadConfig {
            capacities,
            ..config.clone()
        };
        match load_into(&config, &dir, &self.sockets.dir, &self.pins, false) {
            Ok((ebpf, features)) => Ok(Grown {
                ebpf,
                maps_dir: dir,
                features,
                capacities,
            }),
            Err(e) => {
                remove_dir_pins(&dir);
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// The grown generation's service maps, writable (the frontend index keyed with this
    /// agent's secret).
    pub fn grown_maps(&self, grown: &Grown) -> Result<BpfServiceMaps, MapReadError> {
        BpfServiceMaps::open_writer(&grown.maps_dir, self.config.index_secret)
    }

    /// Removes a grown generation not switched to.
    pub fn abandon(&self, grown: Grown) {
        let Grown { ebpf, maps_dir, .. } = grown;
        drop(ebpf);
        remove_dir_pins(&maps_dir);
        let _ = fs::remove_dir(&maps_dir);
    }

    /// Makes the grown generation this agent's: what the programs keep in the current maps
    /// (the client cgroups' session-affinity tables, the data path's counters) is copied over,
    /// then, when `attach` (the programs were attached), the grown generation's programs are
    /// attached make-before-break and the current generation removed. Choices and counts made
    /// between the copy and the attach are lost (an affinity choice is made again).
    pub fn switch(&mut self, mut grown: Grown, attach: bool) -> Result<(), LoadError> {
        carry_affinity(&mut grown.ebpf, &self.maps_dir).map_err(LoadError::Carry)?;
        carry_counters(&mut grown.ebpf, &self.maps_dir).map_err(LoadError::Carry)?;
        self.ebpf = grown.ebpf;
        self.maps_dir = grown.maps_dir;
        self.features = grown.features;
        self.capacities = grown.capacities;
        if attach {
            self.attach()?;
        }
        Ok(())
    }

    /// Attaches every program to the cgroup, make-before-break, then removes what an older
    /// agent left: links of programs this one does not have, and other generations' maps.
    /// Returns each program's kernel id.
    pub fn attach(&mut self) -> Result<Vec<(&'static str, u32)>, LoadError> {
        let cgroup = fs::File::open(&self.cgroup).map_err(|source| LoadError::Cgroup {
            path: self.cgroup.clone(),
            source,
        })?;
        let release = self.features.enabled(Feature::SocketRelease);
        let names = program::ALL
            .iter()
            .copied()
            .chain(release.then_some(program::RELEASE));
        let mut ids = Vec::new();
        for name in names {
            let fail = |what, source| LoadError::Program {
                program: name,
                what,
                source,
            };
            // The same three steps for either program type (aya gives each its own link types).
            macro_rules! attach_link {
                ($prog:expr) => {{
                    let prog = $prog;
                    let id = prog.info().map_err(|e| fail("reading its id", e))?.id();
                    let link_id = prog
                        .attach(&cgroup, CgroupAttachMode::Single)
                        .map_err(|e| fail("attaching", e))?;
                    let link = prog
                        .take_link(link_id)
                        .map_err(|e| fail("taking its link", e))?;
                    (id, FdLink::try_from(link))
                }};
            }
            let (id, link) = match self.ebpf.program_mut(name) {
                Some(Program::CgroupSockAddr(prog)) => attach_link!(prog),
                Some(Program::CgroupSock(prog)) => attach_link!(prog),
                _ => return Err(LoadError::MissingProgram { program: name }),
            };
            let link = link.map_err(|source| LoadError::Link {
                program: name,
                source,
            })?;
            pin_link(&self.pins, name, link)?;
            ids.push((name, id));
        }
        // Only now: a record counted or a slot taken before the release program was attached
        // would never be given back.
        write_config(&mut self.ebpf, self.config)?;
        remove_stale(
            &self.pins,
            &self.programs(),
            &self.maps_dir,
            &self.sockets.dir,
        );
        Ok(ids)
    }
}

/// Creates or opens the maps under their pins, loads the core programs, tries the optional
/// parts and writes the settings that depend on them.
fn load_into(
    config: &LoadConfig,
    maps_dir: &Path,
    sockets_dir: &Path,
    pins: &PinFolder,
    adopted: bool,
) -> Result<(Ebpf, Features), LoadError> {
    mkdir(maps_dir)?;
    mkdir(sockets_dir)?;
    check_pinned_maps(maps_dir, pins, &config.capacities)?;
    check_pinned_maps(sockets_dir, pins, &config.capacities)?;
    sysfs::raise_memlock_limit();
    let dir_of = |d: &MapDescriptor| if d.per_socket { sockets_dir } else { maps_dir };
    // Slots taken by programs that did not write `SLOTS_HELD` (an older agent's): made now
    // beside them, it must say every slot may be held.
    let slots_unmarked = sockets_dir.join(MapId::Connections.name()).exists()
        && !sockets_dir.join(MapId::SlotsHeld.name()).exists();
    let paths: Vec<(MapId, PathBuf)> = lb_common::MAPS
        .iter()
        .map(|d| (d.id, dir_of(d).join(d.name)))
        .collect();
    let (site, cookie_proof) = proof::decide(config.disabled.contains(&Feature::CookieProof));
    let load = |site: Option<&proof::Site>, cookie_proof: &super::features::Probe| {
        load_and_probe(
            config,
            &paths,
            sockets_dir,
            slots_unmarked,
            site,
            cookie_proof,
        )
    };
    let first = load(site.as_ref(), &cookie_proof);
    // The trial programs loaded with the proof; should socklb's own be refused with it (the
    // core, or the release program where the flag leaves it on), they load without it.
    let refused_with_proof = match &first {
        Err(e) => Some(e.to_string()),
        Ok((_, f))
            if !f.enabled(Feature::SocketRelease)
                && !config.disabled.contains(&Feature::SocketRelease) =>
        {
            f.probe(Feature::SocketRelease)
                .and_then(|p| p.reason.clone())
        }
        Ok(_) => None,
    };
    let (mut ebpf, features) = match (site, refused_with_proof) {
        (Some(_), Some(reason)) => {
            drop(first);
            tracing::warn!(
                reason = %reason,
                "socklb's programs were refused with the cookie proof written; loading them without it"
            );
            let refused = super::features::Probe {
                feature: Feature::CookieProof,
                state: super::features::State::Refused,
                errno: None,
                reason: Some(format!(
                    "socklb's programs were refused with it written: {reason}"
                )),
            };
            load(None, &refused)?
        }
        _ => first?,
    };
    if !adopted {
        // A new generation: no bound and no slots until `attach` writes the settings (an
        // all-zero entry would read as a bound of 0).
        write_config(&mut ebpf, DatapathConfig::default())?;
        for dir in pins.map_dirs().iter().filter(|d| d.as_path() != maps_dir) {
            match carry_backend_ports(&mut ebpf, dir) {
                Ok(0) => {}
                Ok(words) => tracing::info!(
                    from = %dir.display(),
                    words,
                    "carried the backend port bitmap of the previous layout"
                ),
                Err(e) => tracing::warn!(
                    from = %dir.display(),
                    error = %e,
                    "could not carry the backend port bitmap of the previous layout: a connection made before the migration to a port no backend uses now reports its backend from getpeername and keeps its connection slot"
                ),
            }
        }
    }
    Ok((ebpf, features))
}

/// Parses socklb's object with the cookie proof written for `site` (or off), its maps on the
/// pins at `paths`, loads the core and tries every optional part.
fn load_and_probe(
    config: &LoadConfig,
    paths: &[(MapId, PathBuf)],
    sockets_dir: &Path,
    slots_unmarked: bool,
    site: Option<&proof::Site>,
    cookie_proof: &super::features::Probe,
) -> Result<(Ebpf, Features), LoadError> {
    let object = object_with(site)?;
    // The loader holds the kernel's BTF it parsed (9 MiB here): gone before the probes parse
    // it again, so the agent's start does not hold both.
    let mut ebpf = {
        let mut loader = EbpfLoader::new();
        for (map, path) in paths {
            loader.map_pin_path(map.name(), path.as_path());
            if map.descriptor().capacity_flag.is_some() {
                loader.map_max_entries(map.name(), config.capacities.get(*map));
            }
        }
        let record_tcp = u8::from(config.record_tcp);
        loader
            .override_global(aya_log::LEVEL, &config.log_level, true)
            .override_global("RECORD_TCP", &record_tcp, true);
        loader.load(object.bytes()).map_err(LoadError::object)?
    };
    drop(object);
    for (_, path) in paths {
        restrict(path, 0o600);
    }
    if slots_unmarked {
        mark_every_slot_held(&mut ebpf)?;
    }
    load_core(&mut ebpf)?;
    let sockets = map_fd(&ebpf, MapId::Sockets)?;
    let features = probe::probe_all(
        &mut ebpf,
        sockets.as_fd(),
        &config.disabled,
        Some(sockets_dir),
        cookie_proof,
    );
    Ok((ebpf, features))
}

/// The generation an agent configured with `requested` sizes uses: the one of exactly those
/// sizes when it is pinned, else one the maps grew into while an earlier agent ran, of this map
/// layout, whose every map is at least as large (they stay grown: the restart needs no
/// migration and loses nothing to room), the largest first; else a new one of those sizes (a
/// generation of other sizes that did not grow is migrated from, as an operator who changed
/// `--max-*` means).
fn generation_for(pins: &PinFolder, requested: &Capacities) -> (PathBuf, Capacities) {
    let exact = pins.generation(&layout_digest(requested));
    if exact.join(MapId::Frontends4.name()).exists() {
        return (exact, *requested);
    }
    let mut grown: Vec<(u64, PathBuf, Capacities)> = pins
        .map_dirs()
        .into_iter()
        .filter_map(|dir| {
            let caps = pinned_capacities(&dir)?;
            let ok = dir == pins.grown_generation(&layout_digest(&caps))
                && lb_common::MAPS
                    .iter()
                    .filter(|d| d.capacity_flag.is_some())
                    .all(|d| caps.get(d.id) >= requested.get(d.id));
            ok.then(|| {
                let total = lb_common::MAPS
                    .iter()
                    .map(|d| u64::from(caps.get(d.id)))
                    .sum();
                (total, dir, caps)
            })
        })
        .collect();
    grown.sort_by_key(|(total, ..)| std::cmp::Reverse(*total));
    match grown.into_iter().next() {
        Some((_, dir, caps)) => {
            tracing::info!(maps = %dir.display(), "adopting maps that grew beyond the configured sizes");
            (dir, caps)
        }
        None => (exact, *requested),
    }
}

/// The sizes of a pinned generation's maps, when every map of this layout is pinned there with
/// this layout's key and value sizes.
fn pinned_capacities(dir: &Path) -> Option<Capacities> {
    let mut caps = Capacities::default();
    for d in lb_common::MAPS.iter().filter(|d| !d.per_socket) {
        let info = MapData::from_pin(dir.join(d.name)).ok()?.info().ok()?;
        if info.key_size() != d.key_size || info.value_size() != d.value_size {
            return None;
        }
        if d.capacity_flag.is_some() {
            caps = caps.with(d.id, info.max_entries());
        }
    }
    Some(caps)
}

/// Copies the client cgroups' affinity tables of the generation in `old_dir` into this one's
/// (the same service ids: the grown maps hold the same sets at the same places).
fn carry_affinity(ebpf: &mut Ebpf, old_dir: &Path) -> Result<usize, aya::maps::MapError> {
    use aya::maps::HashMap;
    let map = MapId::Affinity;
    let old: HashMap<MapData, u64, lb_common::AffinityTable> = HashMap::try_from(
        aya::maps::Map::LruHashMap(MapData::from_pin(old_dir.join(map.name()))?),
    )?;
    let Some(new_map) = ebpf.map_mut(map.name()) else {
        return Ok(0);
    };
    let mut new: HashMap<&mut MapData, u64, lb_common::AffinityTable> = HashMap::try_from(new_map)?;
    let mut carried = 0;
    for entry in &old {
        let (client, table) = entry?;
        new.insert(client, table, 0)?;
        carried += 1;
    }
    Ok(carried)
}

/// Copies the data path's per-CPU counters of the generation in `old_dir` into this one's, so
/// that the counters the agent exports keep counting up across the move.
fn carry_counters(ebpf: &mut Ebpf, old_dir: &Path) -> Result<(), aya::maps::MapError> {
    use aya::maps::PerCpuArray;
    let map = MapId::Counters;
    let old: PerCpuArray<MapData, u64> = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(
        MapData::from_pin(old_dir.join(map.name()))?,
    ))?;
    let Some(new_map) = ebpf.map_mut(map.name()) else {
        return Ok(());
    };
    let mut new: PerCpuArray<&mut MapData, u64> = PerCpuArray::try_from(new_map)?;
    for c in lb_common::Counter::ALL {
        let index = c as u32;
        let values = old.get(&index, 0)?;
        new.set(index, values, 0)?;
    }
    Ok(())
}

/// Copies the backend port bitmap of an older generation's `PORTS` (same array size) into
/// this one's. getpeername and recvmsg look for a connection's record only on ports in the
/// bitmap (the release program looks at every socket's slot); within a generation the
/// bitmap only grows, so a connection made before the migration must keep its port's bit too.
/// A bit too many costs a record lookup, never a wrong answer. Returns the words carried.
fn carry_backend_ports(ebpf: &mut Ebpf, old_dir: &Path) -> Result<usize, aya::maps::MapError> {
    use lb_common::ports;
    let path = old_dir.join(MapId::Ports.name());
    if !path.exists() {
        return Ok(0);
    }
    let old_data = MapData::from_pin(&path)?;
    if old_data.info()?.max_entries() != ports::WORDS {
        // Another layout of the bitmaps: its words mean other things.
        return Ok(0);
    }
    let old: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(old_data))?;
    let Some(map) = ebpf.map_mut(MapId::Ports.name()) else {
        return Ok(0);
    };
    let mut new: Array<&mut MapData, u64> = Array::try_from(map)?;
    let mut carried = 0;
    for word in ports::BACKEND..ports::FRONTEND_PORTS {
        let bits = old.get(&word, 0)?;
        if bits != 0 {
            let mine = new.get(&word, 0)?;
            new.set(word, mine | bits, 0)?;
            carried += 1;
        }
    }
    Ok(carried)
}

/// Loads (verifies) every cgroup program: translation needs all of them.
pub fn load_core(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    for name in program::ALL {
        let prog = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram { program: name })?;
        let Program::CgroupSockAddr(prog) = prog else {
            return Err(LoadError::MissingProgram { program: name });
        };
        prog.load().map_err(|e| LoadError::refused(name, e))?;
    }
    Ok(())
}

/// A descriptor of the object's socket-storage map `map`, owned.
fn map_fd(ebpf: &Ebpf, map: MapId) -> Result<OwnedFd, LoadError> {
    let Some(aya::maps::Map::SkStorage(data)) = ebpf.map(map.name()) else {
        return Err(LoadError::MissingMap { map });
    };
    data.fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| LoadError::MapFd { map, source })
}

/// The settings the programs read now (an adopted generation's are the last agent's).
fn read_config(ebpf: &Ebpf) -> Result<DatapathConfig, LoadError> {
    let map = ebpf
        .map(MapId::Config.name())
        .ok_or(LoadError::MissingMap { map: MapId::Config })?;
    let array: Array<&MapData, DatapathConfig> = Array::try_from(map).map_err(LoadError::Config)?;
    array.get(&0, 0).map_err(LoadError::Config)
}

/// Fills `SLOTS_HELD` with 1 (before any program that reads it is attached): each byte goes to
/// 0 when the socket that holds its slot closes.
fn mark_every_slot_held(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let map = ebpf
        .map_mut(MapId::SlotsHeld.name())
        .ok_or(LoadError::MissingMap {
            map: MapId::SlotsHeld,
        })?;
    let mut array: Array<&mut MapData, lb_common::SlotsHeld> =
        Array::try_from(map).map_err(LoadError::SlotsHeld)?;
    for entry in 0..MapId::SlotsHeld.default_capacity() {
        array
            .set(entry, lb_common::SlotsHeld::ALL, 0)
            .map_err(LoadError::SlotsHeld)?;
    }
    tracing::info!(
        "marked every connection slot as possibly held (the slots were taken by programs of an agent older than SLOTS_HELD)"
    );
    Ok(())
}

fn write_config(ebpf: &mut Ebpf, config: DatapathConfig) -> Result<(), LoadError> {
    let map = ebpf
        .map_mut(MapId::Config.name())
        .ok_or(LoadError::MissingMap { map: MapId::Config })?;
    let mut array: Array<&mut MapData, DatapathConfig> =
        Array::try_from(map).map_err(LoadError::Config)?;
    array.set(0, config, 0).map_err(LoadError::Config)
}

/// Loads the eBPF object on throwaway maps (nothing pinned, nothing attached) and tries the
/// core and every optional part: what `socklb version --features` reports. `Err` when the core
/// does not load.
pub fn probe_kernel(disabled: &BTreeSet<Feature>) -> Result<Features, LoadError> {
    let (mut ebpf, cookie_proof) = throwaway_object_with(disabled.contains(&Feature::CookieProof))?;
    load_core(&mut ebpf)?;
    let sockets = map_fd(&ebpf, MapId::Sockets)?;
    Ok(probe::probe_all(
        &mut ebpf,
        sockets.as_fd(),
        disabled,
        None,
        &cookie_proof,
    ))
}

/// The eBPF object with its maps created small and unpinned (gone with the `Ebpf`), no program
/// loaded yet: for probes and tests.
pub fn throwaway_object() -> Result<Ebpf, LoadError> {
    throwaway_object_with(false).map(|(ebpf, _)| ebpf)
}

/// [`throwaway_object`], with the cookie proof's verdict (`proof_off`: turned off).
fn throwaway_object_with(proof_off: bool) -> Result<(Ebpf, super::features::Probe), LoadError> {
    sysfs::raise_memlock_limit();
    let (site, cookie_proof) = proof::decide(proof_off);
    let object = object_with(site.as_ref())?;
    let mut loader = EbpfLoader::new();
    for d in lb_common::MAPS {
        // A ring buffer is sized in pages (it keeps its size).
        if d.default_capacity > 1024 && d.kind != lb_common::MapKind::RingBuf {
            loader.map_max_entries(d.name, 1024);
        }
    }
    let ebpf = loader.load(object.bytes()).map_err(LoadError::object)?;
    Ok((ebpf, cookie_proof))
}

/// socklb's object with the cookie proof's instructions written for `site` (`lb_common::proof`).
fn object_with(site: Option<&proof::Site>) -> Result<proof::AlignedObject, LoadError> {
    let (object, written) = proof::write_into(EBPF_OBJECT, site).map_err(LoadError::ObjectCopy)?;
    // The copy is what aya parses: the binary's own pages of the object (0.9 MiB) would stay in
    // the agent's RSS for its whole life otherwise.
    // SAFETY: `include_bytes_aligned!` bytes in an immutable static: the binary's read-only
    // data, never written and without relocations.
    if let Err(e) = unsafe { sys::forget_resident(EBPF_OBJECT) } {
        tracing::debug!(error = %e, "the embedded eBPF object's pages stay resident");
    }
    if written.contains(&0) {
        return Err(LoadError::NoProofMarker);
    }
    Ok(object)
}

/// Pins a new link beside the old one, moves the pin over it, then lets the old link go: there
/// is no moment without a program.
fn pin_link(pins: &PinFolder, name: &'static str, link: FdLink) -> Result<(), LoadError> {
    let pin = pins.link(name);
    // bpffs refuses names with a dot.
    let staging = pins.links().join(format!("{name}_new"));
    let _ = fs::remove_file(&staging);
    let old = PinnedLink::from_pin(&pin).ok();
    let pinned = link.pin(&staging).map_err(|source| LoadError::PinLink {
        program: name,
        path: staging.clone(),
        source,
    })?;
    fs::rename(&staging, &pin).map_err(|source| LoadError::PinFolder {
        path: pin.clone(),
        op: PinOp::Move,
        source,
    })?;
    restrict(&pin, 0o600);
    drop(pinned);
    // The old link lost its pin; dropping our descriptor detaches it.
    drop(old);
    Ok(())
}

/// Links of programs this agent does not have (an older agent's), and map directories of other
/// layouts, once this agent's programs are attached.
fn remove_stale(pins: &PinFolder, programs: &[&str], keep: &Path, keep_sockets: &Path) {
    if let Ok(entries) = fs::read_dir(pins.links()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !programs.contains(&name.as_str()) {
                detach_pin(&entry.path());
                tracing::info!(link = %name, "removed an older agent's link");
            }
        }
    }
    for dir in pins.map_dirs() {
        if dir != keep {
            remove_dir_pins(&dir);
            tracing::info!(maps = %dir.display(), "removed another layout's maps (migrated)");
        }
    }
    for dir in pins.socket_dirs() {
        if dir != keep_sockets {
            remove_dir_pins(&dir);
            tracing::info!(maps = %dir.display(), "removed another record layout's socket maps (migrated; sockets connected before keep their connection, getpeername reports their backend)");
        }
    }
}

fn detach_pin(path: &Path) {
    match PinnedLink::from_pin(path) {
        // Unpinning leaves our descriptor as the last reference; dropping it detaches.
        Ok(link) => drop(link.unpin()),
        Err(_) => drop(fs::remove_file(path)),
    }
}

fn remove_dir_pins(dir: &Path) -> usize {
    let mut n = 0;
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if fs::remove_file(entry.path()).is_ok() {
                n += 1;
            }
        }
    }
    let _ = fs::remove_dir(dir);
    n
}

fn mkdir(dir: &Path) -> Result<(), LoadError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| LoadError::PinFolder {
            path: dir.to_path_buf(),
            op: PinOp::Create,
            source,
        })?;
    restrict(dir, 0o700);
    Ok(())
}

/// Creates the pin folder (0700) on a bpf filesystem, mounting one on /sys/fs/bpf if the
/// folder lives there and nothing is mounted yet.
fn prepare_pin_folder(pins: &PinFolder) -> Result<(), LoadError> {
    let parent = pins.root.parent().unwrap_or(Path::new("/"));
    if !sysfs::is_bpffs(parent) && !sysfs::is_bpffs(&pins.root) {
        let default = Path::new(sysfs::DEFAULT_BPFFS);
        let err = |op, source| LoadError::PinFolder {
            path: default.to_path_buf(),
            op,
            source,
        };
        if pins.root.starts_with(default) {
            fs::create_dir_all(default).map_err(|e| err(PinOp::Create, e))?;
            sysfs::mount_bpffs(default).map_err(|e| err(PinOp::Mount, e))?;
        } else {
            return Err(LoadError::NotBpffs {
                path: pins.root.clone(),
            });
        }
    }
    mkdir(&pins.root)?;
    mkdir(&pins.links())
}

/// Refuses pinned maps of this generation whose layout differs from the table (a digest
/// collision or a hand-made pin).
fn check_pinned_maps(dir: &Path, pins: &PinFolder, caps: &Capacities) -> Result<(), LoadError> {
    for d in lb_common::MAPS {
        let path = dir.join(d.name);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path).map_err(|source| LoadError::PinnedMap {
            path: path.clone(),
            source,
        })?;
        let info = data.info().map_err(|source| LoadError::PinnedMap {
            path: path.clone(),
            source,
        })?;
        let incompatible = |detail: String| LoadError::IncompatiblePin {
            map: d.id,
            detail,
            folder: pins.root.clone(),
        };
        if info.key_size() != d.key_size || info.value_size() != d.value_size {
            return Err(incompatible(format!(
                "key/value sizes {}/{}, expected {}/{}",
                info.key_size(),
                info.value_size(),
                d.key_size,
                d.value_size
            )));
        }
        if sized(&d) && info.max_entries() != caps.get(d.id) {
            return Err(incompatible(format!(
                "{} entries, configured {}",
                info.max_entries(),
                caps.get(d.id)
            )));
        }
    }
    Ok(())
}

fn sized(d: &MapDescriptor) -> bool {
    d.kind != MapKind::SkStorage
}

/// What `remove_pins` took away.
#[derive(Debug, Default)]
pub struct Removed {
    pub links: usize,
    pub maps: usize,
}

/// Detaches every pinned link and removes every pin (and the folder). Connects to services stop
/// being translated at once. Refuses while an agent holds the folder.
pub fn remove_pins(pins: &PinFolder) -> Result<Removed, LoadError> {
    let _lock = PinLock::take(&pins.root)?;
    let mut removed = Removed::default();
    if let Ok(entries) = fs::read_dir(pins.links()) {
        for entry in entries.flatten() {
            detach_pin(&entry.path());
            removed.links += 1;
        }
    }
    for dir in pins.map_dirs().into_iter().chain(pins.socket_dirs()) {
        removed.maps += remove_dir_pins(&dir);
    }
    for dir in [pins.links(), pins.root.clone()] {
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(LoadError::PinFolder {
                    path: dir,
                    op: PinOp::Remove,
                    source,
                });
            }
        }
    }
    Ok(removed)
}

/// An attached program, as the kernel reports it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ProgramView {
    pub name: String,
    pub id: u32,
    /// Instructions after the verifier's rewrites (`xlated_prog_len / 8`).
    pub instructions: Option<u32>,
    /// Instructions the verifier processed to prove the program safe.
    pub verified_instructions: Option<u32>,
    /// Runs and total run time; counted only while BPF statistics are enabled
    /// (`sysctl kernel.bpf_stats_enabled=1`, or a `BPF_ENABLE_STATS` holder such as the
    /// benchmark).
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// The programs behind the pinned links.
pub fn attached_programs(pins: &PinFolder) -> io::Result<Vec<ProgramView>> {
    let mut ids = Vec::new();
    for name in program::ALL.into_iter().chain([program::RELEASE]) {
        let Ok(link) = PinnedLink::from_pin(pins.link(name)) else {
            continue;
        };
        let link: FdLink = link.into();
        let info = link.info().map_err(io::Error::other)?;
        ids.push((name, info.program_id()));
    }
    let mut out = Vec::new();
    for info in aya::programs::loaded_programs().flatten() {
        if let Some((name, _)) = ids.iter().find(|(_, id)| *id == info.id()) {
            out.push(ProgramView {
                name: (*name).to_string(),
                id: info.id(),
                instructions: info.size_translated().map(|b| b / 8),
                verified_instructions: info.verified_instruction_count(),
                run_count: info.run_count(),
                run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
            });
        }
    }
    out.sort_by_key(|p| {
        program::ALL
            .iter()
            .position(|n| *n == p.name)
            .unwrap_or(program::ALL.len())
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use lb_common::{MAPS, MapKind};

    use super::EBPF_OBJECT;

    /// Whether the page holding `addr` is mapped in this process (`/proc/self/pagemap`'s
    /// present bit, which needs no privilege).
    fn resident(addr: usize) -> bool {
        use std::os::unix::fs::FileExt;
        let page = rustix::param::page_size();
        let mut entry = [0u8; 8];
        std::fs::File::open("/proc/self/pagemap")
            .and_then(|f| f.read_exact_at(&mut entry, (addr / page * 8) as u64))
            .expect("/proc/self/pagemap");
        u64::from_le_bytes(entry) >> 63 == 1
    }

    /// Pages of read-only data given back leave the resident set and read back unchanged: 192
    /// KiB of a static of this test's own, whole pages at any page size up to 64 KiB (the
    /// embedded object's pages are read by other tests at the same time, which would map them
    /// again).
    #[test]
    fn pages_given_back_leave_the_resident_set_and_read_back_the_same() {
        use sha2::Digest;
        #[repr(C, align(65536))]
        struct Pages([u8; 3 * 65536]);
        static PAGES: Pages = {
            let mut b = [0u8; 3 * 65536];
            let mut i = 0;
            while i < b.len() {
                b[i] = (i % 251) as u8 + 1;
                i += 1;
            }
            Pages(b)
        };
        let bytes: &'static [u8] = &PAGES.0;
        let digest = || sha2::Sha256::digest(bytes);
        let before = digest();
        let middle = bytes.as_ptr() as usize + bytes.len() / 2;
        assert!(resident(middle), "the pages were just read");
        // SAFETY: an immutable static of plain bytes, in the test binary's read-only data.
        let given = unsafe { super::sys::forget_resident(bytes) }.expect("madvise");
        let page = rustix::param::page_size();
        assert!(
            given >= bytes.len() - page,
            "{given} of {} bytes given back",
            bytes.len()
        );
        assert!(!resident(middle), "the pages are still mapped");
        assert_eq!(digest(), before, "the pages read back the same");
        assert!(resident(middle));
    }

    /// `bpf_map_type` numbers (include/uapi/linux/bpf.h).
    fn map_type(kind: MapKind) -> u32 {
        match kind {
            MapKind::Hash => 1,
            MapKind::Array => 2,
            MapKind::PerCpuArray => 6,
            MapKind::LruHash => 9,
            MapKind::SkStorage => 24,
            MapKind::RingBuf => 27,
        }
    }

    /// The programs' side of the ABI declares exactly the maps of `lb_common::MAPS`, with its
    /// names, kinds, key and value sizes, default sizes and allocation: a map renamed, resized
    /// or added on one side only fails here, not when an agent loads on a node.
    #[test]
    fn the_ebpf_object_declares_exactly_the_maps_of_the_table() {
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
        // Sections (.rodata, .bss) and aya-log's ring buffer are not socklb's maps.
        let mut declared: Vec<&str> = object
            .maps
            .keys()
            .map(String::as_str)
            .filter(|n| !n.starts_with('.') && *n != "AYA_LOGS")
            .collect();
        declared.sort_unstable();
        let mut table: Vec<&str> = MAPS.iter().map(|d| d.name).collect();
        table.sort_unstable();
        assert_eq!(
            declared, table,
            "maps in the eBPF object vs lb_common::MAPS"
        );
        for d in MAPS {
            let m = &object.maps[d.name];
            assert_eq!(m.map_type(), map_type(d.kind), "{}: kind", d.name);
            assert_eq!(
                (m.key_size(), m.value_size()),
                (d.key_size, d.value_size),
                "{}: key and value sizes",
                d.name
            );
            assert_eq!(
                m.max_entries(),
                d.default_capacity,
                "{}: default size",
                d.name
            );
            assert_eq!(
                m.map_flags() & lb_common::MAP_F_NO_PREALLOC == 0,
                d.preallocated,
                "{}: allocation",
                d.name
            );
            assert_eq!(
                m.map_flags() & lb_common::MAP_F_MMAPABLE != 0,
                matches!(
                    d.id,
                    lb_common::MapId::Connections
                        | lb_common::MapId::FrontendIndex
                        | lb_common::MapId::FrontendIndex6
                        | lb_common::MapId::SlotsHeld
                ),
                "{}: mmapable (0x{:x})",
                d.name,
                m.map_flags()
            );
        }
    }
}
