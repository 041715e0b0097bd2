//! Which cgroup a socket's records are counted against: its pod's. The programs count a
//! record against the creating process's cgroup ancestor at the pods' level
//! (`DatapathConfig::pod_level`), one level further down under a kubelet quality-of-service tier, so all of a
//! pod's containers share one count; a process outside the pods (a node daemon) is counted
//! against its ancestor at that level, or its own cgroup when it sits higher.
//!
//! The kubelet's layouts, with the programs attached at the cgroup v2 root:
//! - cgroupfs driver: `/kubepods/pod<uid>/<container>` (Guaranteed) and
//!   `/kubepods/{burstable,besteffort}/pod<uid>/<container>`;
//! - systemd driver: `/kubepods.slice/kubepods-pod<uid>.slice/<container>.scope` and
//!   `/kubepods.slice/kubepods-{burstable,besteffort}.slice/kubepods-…-pod<uid>.slice/…`.
//!
//! So the pods' level is one below the `kubepods` cgroup (when the attached cgroup has one as
//! a child), else one below the attached cgroup; its `burstable` and `besteffort` children are
//! the tiers.
use std::{
    io,
    os::unix::fs::MetadataExt as _,
    path::{Component, Path},
};

/// The kubelet's top cgroup, by either cgroup driver.
const KUBEPODS: [&str; 2] = ["kubepods", "kubepods.slice"];
/// Its quality-of-service tiers, by either cgroup driver.
const TIERS: [&str; 4] = [
    "burstable",
    "besteffort",
    "kubepods-burstable.slice",
    "kubepods-besteffort.slice",
];

/// Where pods are in the cgroup tree, as the programs need it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCgroups {
    /// The cgroup level (0: the root) of a pod's cgroup.
    pub level: u32,
    /// The cgroup ids of the quality-of-service tiers (0: none).
    pub tiers: [u64; 2],
}

/// Finds the pods under the attached cgroup `attach` (a directory of a cgroup v2 mount).
pub fn detect(attach: &Path) -> io::Result<PodCgroups> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    detect_in(&mountinfo, &attach.canonicalize()?)
}

/// `detect`, with the mount table given.
fn detect_in(mountinfo: &str, attach: &Path) -> io::Result<PodCgroups> {
    let attach = attach.to_path_buf();
    let base = level_in(mountinfo, &attach).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is on no cgroup2 mount", attach.display()),
        )
    })?;
    let (parent, parent_level) = match KUBEPODS.iter().map(|n| attach.join(n)).find(|p| p.is_dir())
    {
        Some(kubepods) => (kubepods, base + 1),
        None => (attach, base),
    };
    let mut tiers = [0u64; 2];
    let found = TIERS
        .iter()
        .filter_map(|n| std::fs::metadata(parent.join(n)).ok())
        .filter(std::fs::Metadata::is_dir)
        .map(|m| m.ino());
    for (slot, id) in tiers.iter_mut().zip(found) {
        *slot = id;
    }
    Ok(PodCgroups {
        level: parent_level + 1,
        tiers,
    })
}

/// The cgroup level of `dir` (canonical): the components of its cgroup2 mount's root within
/// the hierarchy (a mount may show a subtree) plus those below the mount point. `None` when no
/// cgroup2 mount holds it.
fn level_in(mountinfo: &str, dir: &Path) -> Option<u32> {
    let mut best: Option<(usize, u32)> = None;
    for line in mountinfo.lines() {
        // fields: id parent major:minor root mountpoint options [optional...] - fstype ...
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(mountpoint)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let Ok(below) = dir.strip_prefix(mountpoint) else {
            continue;
        };
        let depth = components(Path::new(root)) + components(below);
        // The deepest mount point holding `dir` is the one it is seen through.
        let len = mountpoint.len();
        if best.is_none_or(|(l, _)| len > l) {
            best = Some((len, depth));
        }
    }
    best.map(|(_, depth)| depth)
}

fn components(path: &Path) -> u32 {
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 80 0:38 / /run/socklb/cgroup rw,relatime - cgroup2 cgroup2 rw
91 80 0:38 /kubepods.slice/kubepods-pod1.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw
";

    #[test]
    fn levels_count_from_the_hierarchy_root_whatever_the_mount_point() {
        let level = |p: &str| level_in(MOUNTINFO, Path::new(p));
        assert_eq!(level("/sys/fs/cgroup/unified"), Some(0));
        assert_eq!(level("/sys/fs/cgroup/unified/kubepods"), Some(1));
        assert_eq!(level("/run/socklb/cgroup/kubepods.slice/x.slice"), Some(2));
        // A container's view of its own subtree (cgroup namespace-like mount of a subtree).
        assert_eq!(level("/sys/fs/cgroup/c.scope"), Some(3));
        assert_eq!(level("/proc"), None);
    }

    #[test]
    fn a_kubelet_tree_puts_pods_below_kubepods_and_finds_the_tiers() {
        let root = tempfile::tempdir().expect("tempdir");
        for d in [
            "kubepods.slice/kubepods-burstable.slice",
            "kubepods.slice/kubepods-besteffort.slice",
            "kubepods.slice/kubepods-pod1.slice",
            "system.slice",
        ] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let ino = |d: &str| {
            std::fs::metadata(root.path().join(d))
                .expect("metadata")
                .ino()
        };
        let attach = root.path().canonicalize().expect("canonical");
        let mountinfo = format!("1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n", attach.display());
        let pods = detect_in(&mountinfo, &attach).expect("detect");
        assert_eq!(
            pods,
            PodCgroups {
                level: 2,
                tiers: [
                    ino("kubepods.slice/kubepods-burstable.slice"),
                    ino("kubepods.slice/kubepods-besteffort.slice")
                ],
            }
        );
    }

    #[test]
    fn without_kubepods_the_attached_cgroups_children_are_the_pods() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("pod-a")).expect("mkdir");
        let attach = root.path().canonicalize().expect("canonical");
        let mountinfo = format!(
            "1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n",
            attach.parent().expect("parent").display()
        );
        let pods = detect_in(&mountinfo, &attach).expect("detect");
        assert_eq!(
            pods,
            PodCgroups {
                level: 2,
                tiers: [0, 0]
            }
        );
    }
}
