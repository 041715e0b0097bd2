//! Loading the programs, pinning maps and links, adopting what a previous agent pinned, and
//! removing it all again.
//!
//! Pin layout under the pin folder (default `/sys/fs/bpf/socklb`, mode 0700):
//! `maps/<MAP>` for every map and `links/<program>` for every cgroup attachment. The pins keep
//! the programs attached and the maps alive while no agent runs, so services keep working.
//!
//! A restarting agent loads its programs against the pinned maps, attaches them next to the
//! pinned links (cgroup links run side by side), moves the pins to the new links, then lets the
//! old ones go: there is no moment without a program.
use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::MapData,
    programs::{CgroupAttachMode, Program, links::FdLink, links::PinnedLink},
};
use lb_common::map_name;

use super::{
    bpf::BpfServiceMaps,
    maps::{Capacities, MapReadError},
};
use crate::dataplane::sysfs;

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"));

/// Every program, in attach order.
pub const PROGRAMS: [&str; 9] = [
    "socklb_connect4",
    "socklb_connect6",
    "socklb_sendmsg4",
    "socklb_sendmsg6",
    "socklb_recvmsg4",
    "socklb_recvmsg6",
    "socklb_getpeername4",
    "socklb_getpeername6",
    "socklb_sock_release",
];

/// Maps that live in the pin folder.
pub const PINNED_MAPS: [&str; 7] = [
    map_name::FRONTENDS,
    map_name::SLOTS,
    map_name::BACKENDS,
    map_name::SERVICE_META,
    map_name::SOCK_STATE,
    map_name::AFFINITY,
    map_name::COUNTERS,
];

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {message}")]
    PinFolder { path: PathBuf, message: String },
    #[error("--cgroup {path}: {message}")]
    Cgroup { path: PathBuf, message: String },
    #[error(
        "pinned map {map} does not match this socklb ({detail}); `socklb reset --bpffs {folder}` removes the old state"
    )]
    IncompatiblePin {
        map: &'static str,
        detail: String,
        folder: PathBuf,
    },
    #[error("loading the eBPF object: {0}{hint}", hint = permission_hint(.0))]
    Object(String),
    #[error("program {program}: {message}{hint}", hint = permission_hint(.message))]
    Program {
        program: &'static str,
        message: String,
    },
    #[error(transparent)]
    Maps(#[from] MapReadError),
}

fn permission_hint(message: &str) -> &'static str {
    if message.contains("Operation not permitted") || message.contains("EPERM") {
        " (socklb needs root, or CAP_BPF + CAP_SYS_ADMIN + CAP_NET_ADMIN)"
    } else {
        ""
    }
}

/// What to load and where.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The pin folder, on a bpf filesystem.
    pub pin_folder: PathBuf,
    /// The cgroup v2 directory whose processes get socket-level load balancing.
    pub cgroup: PathBuf,
    pub capacities: Capacities,
    pub affinity_capacity: u32,
    /// Live translated sockets whose reverse translation is kept.
    pub sock_state_capacity: u32,
    /// aya-log level in the programs: 0 = off (the logging code is removed by the verifier),
    /// 1 error .. 5 trace.
    pub log_level: u8,
}

/// The pin folder's layout.
#[derive(Clone, Debug)]
pub struct PinFolder {
    pub root: PathBuf,
}

impl PinFolder {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.links().join(program)
    }

    /// Whether an agent has pinned state here.
    pub fn exists(&self) -> bool {
        self.map(map_name::FRONTENDS).exists()
    }
}

/// The loaded programs and their maps. Dropping it keeps everything attached (the pins hold it).
pub struct Dataplane {
    pub ebpf: Ebpf,
    pub pins: PinFolder,
    /// Program name → kernel program id, for stats.
    pub program_ids: Vec<(&'static str, u32)>,
}

impl Dataplane {
    /// Loads the programs against the pinned maps (creating and pinning them the first time)
    /// and attaches them to the cgroup, replacing a previous agent's attachments.
    pub fn load(config: &LoadConfig) -> Result<Self, LoadError> {
        let pins = PinFolder::new(&config.pin_folder);
        prepare_pin_folder(&pins)?;
        check_cgroup(&config.cgroup)?;
        check_pinned_maps(&pins, config)?;
        sysfs::raise_memlock_limit();

        let mut loader = EbpfLoader::new();
        let map_paths: Vec<(&str, PathBuf)> =
            PINNED_MAPS.iter().map(|m| (*m, pins.map(m))).collect();
        for (name, path) in &map_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let caps = &config.capacities;
        loader
            .map_max_entries(map_name::FRONTENDS, caps.frontends)
            .map_max_entries(map_name::SLOTS, caps.slots)
            .map_max_entries(map_name::BACKENDS, caps.backends)
            .map_max_entries(map_name::SERVICE_META, caps.service_meta)
            .map_max_entries(map_name::AFFINITY, config.affinity_capacity)
            .map_max_entries(map_name::SOCK_STATE, config.sock_state_capacity)
            .override_global(aya_log::LEVEL, &config.log_level, true);
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|e| LoadError::Object(error_chain(&e)))?;
        for name in PINNED_MAPS {
            restrict(&pins.map(name), 0o600);
        }

        let cgroup = fs::File::open(&config.cgroup).map_err(|e| LoadError::Cgroup {
            path: config.cgroup.clone(),
            message: e.to_string(),
        })?;
        let mut program_ids = Vec::new();
        for program in PROGRAMS {
            let id = attach(&mut ebpf, program, &cgroup, &pins)?;
            program_ids.push((program, id));
        }
        Ok(Self {
            ebpf,
            pins,
            program_ids,
        })
    }

    /// The service maps, writable (a separate descriptor on the pinned maps).
    pub fn service_maps(&self) -> Result<BpfServiceMaps, MapReadError> {
        BpfServiceMaps::open_pinned(&self.pins.maps(), false)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

fn attach(
    ebpf: &mut Ebpf,
    program: &'static str,
    cgroup: &fs::File,
    pins: &PinFolder,
) -> Result<u32, LoadError> {
    let fail = |message: String| LoadError::Program { program, message };
    let (id, link) = match ebpf
        .program_mut(program)
        .ok_or_else(|| fail("missing from the eBPF object".into()))?
    {
        Program::CgroupSockAddr(prog) => {
            prog.load().map_err(|e| fail(verifier_error(&e)))?;
            let id = prog.info().map_err(|e| fail(error_chain(&e)))?.id();
            let link_id = prog
                .attach(cgroup, CgroupAttachMode::Single)
                .map_err(|e| fail(error_chain(&e)))?;
            let link = prog.take_link(link_id).map_err(|e| fail(error_chain(&e)))?;
            (
                id,
                FdLink::try_from(link).map_err(|e| fail(error_chain(&e)))?,
            )
        }
        Program::CgroupSock(prog) => {
            prog.load().map_err(|e| fail(verifier_error(&e)))?;
            let id = prog.info().map_err(|e| fail(error_chain(&e)))?.id();
            let link_id = prog
                .attach(cgroup, CgroupAttachMode::Single)
                .map_err(|e| fail(error_chain(&e)))?;
            let link = prog.take_link(link_id).map_err(|e| fail(error_chain(&e)))?;
            (
                id,
                FdLink::try_from(link).map_err(|e| fail(error_chain(&e)))?,
            )
        }
        other => {
            return Err(fail(format!(
                "unexpected program type {:?}",
                other.prog_type()
            )));
        }
    };

    // Make before break: pin the new link beside the old one, then move the pin over it.
    let pin = pins.link(program);
    // bpffs refuses names with a dot.
    let staging = pins.links().join(format!("{program}_new"));
    let _ = fs::remove_file(&staging);
    let old = PinnedLink::from_pin(&pin).ok();
    let pinned = link
        .pin(&staging)
        .map_err(|e| fail(format!("pinning link: {}", error_chain(&e))))?;
    fs::rename(&staging, &pin).map_err(|e| fail(format!("moving link pin: {e}")))?;
    restrict(&pin, 0o600);
    drop(pinned);
    // The old link lost its pin; dropping our descriptor detaches it.
    drop(old);
    Ok(id)
}

fn verifier_error(e: &aya::programs::ProgramError) -> String {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    {
        let log = verifier_log.to_string();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return format!(
            "the kernel refused it ({io_error}); verifier log tail:\n{}",
            tail.join("\n")
        );
    }
    error_chain(e)
}

fn restrict(path: &Path, mode: u32) {
    if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
        tracing::debug!(path = %path.display(), error = %e, "could not restrict pin permissions");
    }
}

/// Creates the pin folder (0700) on a bpf filesystem, mounting one on /sys/fs/bpf if the
/// folder lives there and nothing is mounted yet.
fn prepare_pin_folder(pins: &PinFolder) -> Result<(), LoadError> {
    let err = |message: String| LoadError::PinFolder {
        path: pins.root.clone(),
        message,
    };
    let parent = pins.root.parent().unwrap_or(Path::new("/"));
    if !sysfs::is_bpffs(parent) && !sysfs::is_bpffs(&pins.root) {
        let default = Path::new(sysfs::DEFAULT_BPFFS);
        if pins.root.starts_with(default) {
            fs::create_dir_all(default).map_err(|e| err(e.to_string()))?;
            sysfs::mount_bpffs(default)
                .map_err(|e| err(format!("mounting bpffs on {}: {e}", default.display())))?;
        } else {
            return Err(err(
                "not on a bpf filesystem; mount one (mount -t bpf bpf DIR) or use the default /sys/fs/bpf/socklb".into(),
            ));
        }
    }
    for dir in [pins.root.clone(), pins.maps(), pins.links()] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        restrict(&dir, 0o700);
    }
    Ok(())
}

fn check_cgroup(path: &Path) -> Result<(), LoadError> {
    if sysfs::is_cgroup2(path) {
        Ok(())
    } else {
        Err(LoadError::Cgroup {
            path: path.to_path_buf(),
            message: "not a cgroup v2 directory (socklb needs cgroup v2; see /proc/self/mountinfo for its mount)"
                .into(),
        })
    }
}

/// Refuses pinned maps whose layout or size differs from what this agent would create.
fn check_pinned_maps(pins: &PinFolder, config: &LoadConfig) -> Result<(), LoadError> {
    use lb_common::{
        AffinityKey, AffinityValue, Backend, Frontend, FrontendKey, ServiceMeta, SlotKey, SockState,
    };
    let caps = &config.capacities;
    let expected: [(&'static str, usize, usize, Option<u32>); 7] = [
        (
            map_name::FRONTENDS,
            size_of::<FrontendKey>(),
            size_of::<Frontend>(),
            Some(caps.frontends),
        ),
        (
            map_name::SLOTS,
            size_of::<SlotKey>(),
            size_of::<u32>(),
            Some(caps.slots),
        ),
        (
            map_name::BACKENDS,
            size_of::<u32>(),
            size_of::<Backend>(),
            Some(caps.backends),
        ),
        (
            map_name::SERVICE_META,
            size_of::<u32>(),
            size_of::<ServiceMeta>(),
            Some(caps.service_meta),
        ),
        (
            map_name::SOCK_STATE,
            size_of::<u64>(),
            size_of::<SockState>(),
            Some(config.sock_state_capacity),
        ),
        (
            map_name::AFFINITY,
            size_of::<AffinityKey>(),
            size_of::<AffinityValue>(),
            Some(config.affinity_capacity),
        ),
        (map_name::COUNTERS, size_of::<u32>(), size_of::<u64>(), None),
    ];
    for (map, key, value, entries) in expected {
        let path = pins.map(map);
        if !path.exists() {
            continue;
        }
        let data = MapData::from_pin(&path).map_err(|e| LoadError::PinFolder {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let info = data.info().map_err(|e| LoadError::PinFolder {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let incompatible = |detail: String| LoadError::IncompatiblePin {
            map,
            detail,
            folder: pins.root.clone(),
        };
        if info.key_size() as usize != key || info.value_size() as usize != value {
            return Err(incompatible(format!(
                "key/value sizes {}/{}, expected {key}/{value}",
                info.key_size(),
                info.value_size()
            )));
        }
        if let Some(entries) = entries
            && info.max_entries() != entries
        {
            return Err(incompatible(format!(
                "{} entries, configured {entries}",
                info.max_entries()
            )));
        }
    }
    Ok(())
}

/// What `remove_pins` took away.
#[derive(Debug, Default)]
pub struct Removed {
    pub links: usize,
    pub maps: usize,
}

/// Detaches every pinned link and removes every pin (and the folder). Connects to services stop
/// being translated at once.
pub fn remove_pins(pins: &PinFolder) -> io::Result<Removed> {
    let mut removed = Removed::default();
    if let Ok(entries) = fs::read_dir(pins.links()) {
        for entry in entries.flatten() {
            let path = entry.path();
            match PinnedLink::from_pin(&path) {
                Ok(link) => {
                    // Unpinning leaves our descriptor as the last reference; dropping it detaches.
                    drop(link.unpin()?);
                    removed.links += 1;
                }
                Err(_) => fs::remove_file(&path)?,
            }
        }
    }
    if let Ok(entries) = fs::read_dir(pins.maps()) {
        for entry in entries.flatten() {
            fs::remove_file(entry.path())?;
            removed.maps += 1;
        }
    }
    for dir in [pins.links(), pins.maps(), pins.root.clone()] {
        match fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// An attached program, as the kernel reports it.
#[derive(Clone, Debug, serde::Serialize)]
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
    for program in PROGRAMS {
        let Ok(link) = PinnedLink::from_pin(pins.link(program)) else {
            continue;
        };
        let link: FdLink = link.into();
        let info = link.info().map_err(|e| io::Error::other(e.to_string()))?;
        ids.push((program, info.program_id()));
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
    out.sort_by_key(|p| PROGRAMS.iter().position(|n| *n == p.name));
    Ok(out)
}
