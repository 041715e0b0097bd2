//! The real maps: `ServiceMaps` over the pinned BPF maps, and read-only access for `inspect`.
use std::{
    ffi::CString,
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use lb_common::{
    AffinityKey, AffinityValue, Backend, Frontend, FrontendKey, ServiceMeta, SlotKey, counter,
    map_name,
};

use super::maps::{Capacities, MapReadError, MapSnapshot, MapWrite, MapWriteError, ServiceMaps};

/// The service maps (frontends, slots, backends, metadata), writable.
pub struct BpfServiceMaps {
    frontends: HashMap<MapData, FrontendKey, Frontend>,
    slots: HashMap<MapData, SlotKey, u32>,
    backends: HashMap<MapData, u32, Backend>,
    meta: HashMap<MapData, u32, ServiceMeta>,
    capacities: Capacities,
}

fn typed<T: TryFrom<Map, Error = MapError>>(
    name: &'static str,
    data: MapData,
) -> Result<T, MapReadError> {
    T::try_from(Map::from_map_data(data).map_err(|e| read_error(name, &e))?)
        .map_err(|e| read_error(name, &e))
}

fn read_error(map: &'static str, e: &dyn std::fmt::Display) -> MapReadError {
    MapReadError {
        map,
        message: e.to_string(),
    }
}

fn max_entries(name: &'static str, data: &MapData) -> Result<u32, MapReadError> {
    Ok(data.info().map_err(|e| read_error(name, &e))?.max_entries())
}

impl BpfServiceMaps {
    /// Wraps the four service maps (from the loaded object, or opened from their pins).
    pub fn new(
        frontends: MapData,
        slots: MapData,
        backends: MapData,
        meta: MapData,
    ) -> Result<Self, MapReadError> {
        let capacities = Capacities {
            frontends: max_entries(map_name::FRONTENDS, &frontends)?,
            slots: max_entries(map_name::SLOTS, &slots)?,
            backends: max_entries(map_name::BACKENDS, &backends)?,
            service_meta: max_entries(map_name::SERVICE_META, &meta)?,
        };
        Ok(Self {
            frontends: typed(map_name::FRONTENDS, frontends)?,
            slots: typed(map_name::SLOTS, slots)?,
            backends: typed(map_name::BACKENDS, backends)?,
            meta: typed(map_name::SERVICE_META, meta)?,
            capacities,
        })
    }

    /// Opens the pinned service maps under `maps_dir`, read-only when `read_only`.
    pub fn open_pinned(maps_dir: &Path, read_only: bool) -> Result<Self, MapReadError> {
        let open = |name: &'static str| open_pinned_map(&maps_dir.join(name), name, read_only);
        Self::new(
            open(map_name::FRONTENDS)?,
            open(map_name::SLOTS)?,
            open(map_name::BACKENDS)?,
            open(map_name::SERVICE_META)?,
        )
    }
}

fn write_error(map: &'static str, capacity: u32, e: &MapError) -> MapWriteError {
    if let MapError::SyscallError(aya::sys::SyscallError { io_error, .. }) = e
        && io_error.raw_os_error() == Some(libc::E2BIG)
    {
        return MapWriteError::Full { map, capacity };
    }
    MapWriteError::Io {
        map,
        source: std::io::Error::other(e.to_string()),
    }
}

/// Deleting a key that is already gone is fine.
fn removed(map: &'static str, capacity: u32, r: Result<(), MapError>) -> Result<(), MapWriteError> {
    match r {
        Err(MapError::KeyNotFound) | Ok(()) => Ok(()),
        Err(MapError::SyscallError(aya::sys::SyscallError { io_error, .. }))
            if io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(e) => Err(write_error(map, capacity, &e)),
    }
}

impl ServiceMaps for BpfServiceMaps {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        let map = write.map();
        let cap = self.capacities.of(map);
        let put = |r: Result<(), MapError>| r.map_err(|e| write_error(map, cap, &e));
        match write {
            MapWrite::PutBackend(id, b) => put(self.backends.insert(id, b, 0)),
            MapWrite::DeleteBackend(id) => removed(map, cap, self.backends.remove(id)),
            MapWrite::PutSlot(k, id) => put(self.slots.insert(k, id, 0)),
            MapWrite::DeleteSlot(k) => removed(map, cap, self.slots.remove(k)),
            MapWrite::PutMeta(id, m) => put(self.meta.insert(id, m, 0)),
            MapWrite::DeleteMeta(id) => removed(map, cap, self.meta.remove(id)),
            MapWrite::PutFrontend(k, f) => put(self.frontends.insert(k, f, 0)),
            MapWrite::DeleteFrontend(k) => removed(map, cap, self.frontends.remove(k)),
        }
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        let mut snap = MapSnapshot::default();
        for entry in &self.frontends {
            let (k, v) = entry.map_err(|e| read_error(map_name::FRONTENDS, &e))?;
            snap.frontends.insert(k, v);
        }
        for entry in &self.slots {
            let (k, v) = entry.map_err(|e| read_error(map_name::SLOTS, &e))?;
            snap.slots.insert(k, v);
        }
        for entry in &self.backends {
            let (k, v) = entry.map_err(|e| read_error(map_name::BACKENDS, &e))?;
            snap.backends.insert(k, v);
        }
        for entry in &self.meta {
            let (k, v) = entry.map_err(|e| read_error(map_name::SERVICE_META, &e))?;
            snap.meta.insert(k, v);
        }
        Ok(snap)
    }

    fn capacities(&self) -> Capacities {
        self.capacities
    }
}

/// Opens a pinned map; with `read_only` the kernel hands out a read-only descriptor
/// (`BPF_OBJ_GET` with `BPF_F_RDONLY`), so `inspect` cannot change anything even by mistake.
pub fn open_pinned_map(
    path: &Path,
    name: &'static str,
    read_only: bool,
) -> Result<MapData, MapReadError> {
    // union bpf_attr, BPF_OBJ_GET variant: pathname, bpf_fd, file_flags, path_fd.
    #[repr(C)]
    struct ObjGetAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: [u8; 108],
    }
    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_F_RDONLY: u32 = 1 << 3;
    if !read_only {
        return MapData::from_pin(path)
            .map_err(|e| read_error(name, &format!("{}: {e}", path.display())));
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| read_error(name, &e))?;
    let attr = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: BPF_F_RDONLY,
        path_fd: 0,
        _pad: [0; 108],
    };
    // SAFETY: attr is a valid, zero-padded bpf_attr for BPF_OBJ_GET; c_path outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &raw const attr,
            size_of::<ObjGetAttr>(),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(read_error(name, &format!("{}: {e}", path.display())));
    }
    // SAFETY: the syscall returned a new descriptor that we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    MapData::from_fd(fd).map_err(|e| read_error(name, &e))
}

/// The per-CPU counters, summed over CPUs, indexed by `lb_common::counter`.
pub fn read_counters(data: MapData) -> Result<Vec<u64>, MapReadError> {
    let name = map_name::COUNTERS;
    let array: PerCpuArray<MapData, u64> = typed(name, data)?;
    (0..counter::NAMES.len() as u32)
        .map(|i| {
            array
                .get(&i, 0)
                .map(|values| values.iter().sum())
                .map_err(|e| read_error(name, &e))
        })
        .collect()
}

/// The counters by name, with `lookups` (connects and sendmsgs addressed to a frontend)
/// derived: each ends in exactly one of `translations`, `no_backend` or `errors`.
pub fn named_counters(data: MapData) -> Result<Vec<(&'static str, u64)>, MapReadError> {
    let totals = read_counters(data)?;
    let at = |i: u32| totals.get(i as usize).copied().unwrap_or(0);
    let mut out = vec![(
        "lookups",
        at(counter::TRANSLATIONS) + at(counter::NO_BACKEND) + at(counter::ERRORS),
    )];
    out.extend(counter::NAMES.iter().copied().zip(totals));
    Ok(out)
}

/// Live entries in `SOCK_STATE` and its capacity (walks the keys: a fill level for humans and
/// scrapes, not for hot paths).
pub fn sock_state_fill(data: MapData) -> Result<(usize, u32), MapReadError> {
    let name = map_name::SOCK_STATE;
    let capacity = max_entries(name, &data)?;
    let map: HashMap<MapData, u64, lb_common::SockState> = typed(name, data)?;
    Ok((map.keys().flatten().count(), capacity))
}

/// The session-affinity entries.
pub fn read_affinity(data: MapData) -> Result<Vec<(AffinityKey, AffinityValue)>, MapReadError> {
    let name = map_name::AFFINITY;
    let map: HashMap<MapData, AffinityKey, AffinityValue> = typed(name, data)?;
    map.iter()
        .map(|e| e.map_err(|e| read_error(name, &e)))
        .collect()
}
