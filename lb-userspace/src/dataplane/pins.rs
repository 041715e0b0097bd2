//! The pin folder's layout on bpffs: the links, one map directory per map layout (a
//! generation), one per-socket directory per record layout, and which of them the attached
//! programs use. Below the loader, the map opener and the probes, which all find pins here.
//!
//! Under the pin folder (`--bpffs`, default `/sys/fs/bpf/socklb`, mode 0700, pins 0600 through
//! `restrict`):
//! - `maps-<layout>/<MAP>`: every map of one layout generation (`map_path`). `<layout>` is a
//!   digest of the map table, the configured sizes of the maps that are not per socket and
//!   `lb_common::GENERATION_REVISION` (what their bytes mean, where sizes say nothing)
//!   (`layout_digest`), so an agent whose layout differs creates a new generation instead of
//!   misreading the old one; pinned maps whose sizes disagree with the table are refused.
//! - `sockets-<record layout>/`: the per-socket maps (`SOCKETS`, `CONNECTIONS`, `SLOTS_HELD`,
//!   `SOCKET_QUOTA`) and the links of the iterators the kernel accepted. Named by a digest of
//!   `SOCKETS`'s layout alone (`socket_layout_digest`), so socket records outlive a capacity
//!   migration; a per-socket map beside them whose own layout changed is made again, empty, and a
//!   record folder an older agent named otherwise is taken over when its `SOCKETS` has this layout.
//!   An agent's start removes the UDP iterator link of older agents, whose entries had another
//!   layout.
//! - `links/<program>`: every cgroup attachment, the release program's included.
use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use aya::{
    maps::MapData,
    programs::links::{FdLink, PinnedLink},
};
use lb_common::{MapDescriptor, MapId, program};
use sha2::{Digest as _, Sha256};

use super::{features::Listing, maps::Capacities};

/// The pin folder's layout.
#[derive(Clone, Debug)]
pub struct PinFolder {
    pub root: PathBuf,
}

const GENERATION_PREFIX: &str = "maps-";
/// The end of the name of a generation the maps grew into.
const GROWN_SUFFIX: &str = "-grown";
const SOCKETS_PREFIX: &str = "sockets-";

impl PinFolder {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.links().join(program)
    }

    /// The map directory of a layout generation.
    pub fn generation(&self, layout: &str) -> PathBuf {
        self.root.join(format!("{GENERATION_PREFIX}{layout}"))
    }

    /// The map directory of a generation the maps grew into (past the configured sizes): an
    /// agent started with sizes it holds adopts it rather than migrating back down.
    pub fn grown_generation(&self, layout: &str) -> PathBuf {
        self.root
            .join(format!("{GENERATION_PREFIX}{layout}{GROWN_SUFFIX}"))
    }

    /// Whether `dir` is a generation the maps grew into.
    pub fn is_grown(dir: &Path) -> bool {
        dir.file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(GROWN_SUFFIX))
    }

    /// The directory of the per-socket maps (and the socket iterators' links) of one record
    /// layout: it outlives capacity migrations.
    pub fn sockets(&self, layout: &str) -> PathBuf {
        self.root.join(format!("{SOCKETS_PREFIX}{layout}"))
    }

    /// Every per-socket map directory present.
    pub fn socket_dirs(&self) -> Vec<PathBuf> {
        self.dirs_with_prefix(SOCKETS_PREFIX)
    }

    /// The per-socket maps the attached programs use: the only directory, or the one whose
    /// `SOCKETS` map the attached connect4 program reads.
    pub fn current_sockets(&self) -> Option<SocketPins> {
        let dirs = self.socket_dirs();
        if dirs.len() <= 1 {
            return dirs.into_iter().next().map(SocketPins::new);
        }
        let used = attached_map_ids(self);
        dirs.iter()
            .find(|d| {
                MapData::from_pin(d.join(MapId::Sockets.name()))
                    .ok()
                    .and_then(|m| m.info().ok())
                    .is_some_and(|i| used.contains(&i.id()))
            })
            .or_else(|| dirs.last())
            .cloned()
            .map(SocketPins::new)
    }

    fn dirs_with_prefix(&self, prefix: &str) -> Vec<PathBuf> {
        self.dirs_named(|n| n.starts_with(prefix))
    }

    /// The entries of the pin folder whose names `wanted` accepts, sorted.
    fn dirs_named(&self, wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&wanted))
            .collect();
        out.sort();
        out
    }

    /// Every map directory present (generations, and the unversioned `maps` of older agents).
    pub fn map_dirs(&self) -> Vec<PathBuf> {
        self.dirs_named(|n| n == "maps" || n.starts_with(GENERATION_PREFIX))
    }

    /// The map directory the attached programs use: the only generation, or the one whose
    /// frontend map the attached connect4 program reads.
    pub fn current(&self) -> Option<PathBuf> {
        let dirs: Vec<PathBuf> = self
            .map_dirs()
            .into_iter()
            .filter(|d| d.join(MapId::Frontends4.name()).exists())
            .collect();
        if dirs.len() <= 1 {
            return dirs.into_iter().next();
        }
        let used = attached_map_ids(self);
        dirs.iter()
            .find(|d| {
                MapData::from_pin(d.join(MapId::Frontends4.name()))
                    .ok()
                    .and_then(|m| m.info().ok())
                    .is_some_and(|i| used.contains(&i.id()))
            })
            .cloned()
            .or_else(|| dirs.last().cloned())
    }
}

/// The ids of the maps the attached connect4 program uses.
fn attached_map_ids(pins: &PinFolder) -> Vec<u32> {
    let Ok(link) = PinnedLink::from_pin(pins.link(program::CONNECT4)) else {
        return Vec::new();
    };
    let link: FdLink = link.into();
    let Ok(info) = link.info() else {
        return Vec::new();
    };
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == info.program_id())
        .and_then(|p| p.map_ids().ok().flatten())
        .unwrap_or_default()
}

/// A digest of the map layout and sizes of the generation's maps (the per-socket maps have a
/// digest of their own): two agents with the same digest read each other's maps correctly.
pub fn layout_digest(capacities: &Capacities) -> String {
    digest(
        lb_common::MAPS.iter().filter(|d| !d.per_socket),
        capacities,
        lb_common::GENERATION_REVISION,
    )
}

/// Where `map` is pinned for the generation whose map directory is `generation`: there, or for
/// a per-socket map in the record layout's folder beside it.
pub fn map_path(generation: &Path, map: MapId) -> PathBuf {
    if map.descriptor().per_socket {
        let root = generation.parent().unwrap_or(generation);
        PinFolder::new(root)
            .sockets(&socket_layout_digest())
            .join(map.name())
    } else {
        generation.join(map.name())
    }
}

/// A digest of the socket records' layout (`SOCKETS`): records survive every migration that
/// keeps it. The other per-socket maps beside it (the counts, the connection slots) are
/// replaced where their own layout changed, without moving the records.
pub fn socket_layout_digest() -> String {
    digest(
        lb_common::MAPS.iter().filter(|d| d.id == MapId::Sockets),
        &Capacities::default(),
        0,
    )
}

/// `revision` (what the maps' bytes mean, where their sizes say nothing) is taken in when not 0,
/// so a layout at revision 0 keeps the digest it had before there were revisions.
fn digest<'a>(
    maps: impl Iterator<Item = &'a MapDescriptor>,
    capacities: &Capacities,
    revision: u32,
) -> String {
    let mut h = Sha256::new();
    if revision != 0 {
        h.update(b"revision");
        h.update(revision.to_le_bytes());
    }
    for d in maps {
        h.update(d.name.as_bytes());
        h.update([d.kind as u8, u8::from(d.preallocated)]);
        h.update(d.key_size.to_le_bytes());
        h.update(d.value_size.to_le_bytes());
        h.update(capacities.get(d.id).to_le_bytes());
    }
    h.finalize().iter().take(6).fold(String::new(), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn restrict(path: &Path, mode: u32) {
    if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
        tracing::debug!(path = %path.display(), error = %e, "could not restrict pin permissions");
    }
}

/// The pin of the `SOCKETS` iterator's link, beside the socket maps.
pub const ITER_PIN: &str = "SOCKETS_ITER";
/// The pin of the UDP iterator's link, beside the socket maps.
pub const UDP_ITER_PIN: &str = "UDP_SOCKETS_ITER";
/// Where agents before the UDP iterator wrote addresses pinned it (a `SocketEntry` per socket):
/// an agent's start removes it, so no reader takes one layout for the other.
pub const LEGACY_UDP_ITER_PIN: &str = "UDP_ITER";

/// The pins socket records are read through: the folder holding `SOCKETS` and the iterators.
#[derive(Clone, Debug)]
pub struct SocketPins {
    pub dir: PathBuf,
}

impl SocketPins {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// How records can be read, from the pins present: the agent pins only the iterators the
    /// kernel accepted, and `sock_diag` storage is tried by asking.
    pub fn listing(&self) -> Listing {
        Listing {
            global: self.dir.join(ITER_PIN).exists(),
            tcp_per_namespace: self.dir.join(lb_common::MapId::Sockets.name()).exists(),
            udp_per_namespace: self.dir.join(UDP_ITER_PIN).exists(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A revision of what the maps hold (`lb_common::GENERATION_REVISION`) names a new
    /// generation, which an upgrade migrates to make-before-break as for other sizes
    /// (`deploy::a_new_map_layout_takes_over_make_before_break_under_load`), while the socket
    /// records' folder keeps the name agents before revisions gave it, so records survive the
    /// upgrade.
    #[test]
    fn a_revision_names_a_new_generation_and_keeps_the_records_folder() {
        let caps = Capacities::default();
        let generation_maps = || lb_common::MAPS.iter().filter(|d| !d.per_socket);
        assert_ne!(lb_common::GENERATION_REVISION, 0);
        assert_ne!(layout_digest(&caps), digest(generation_maps(), &caps, 0));
        let records = || lb_common::MAPS.iter().filter(|d| d.id == MapId::Sockets);
        assert_eq!(socket_layout_digest(), digest(records(), &caps, 0));
        assert_ne!(
            digest(records(), &caps, 0),
            digest(records(), &caps, lb_common::GENERATION_REVISION)
        );
    }
}
