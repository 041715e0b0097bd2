//! Which cgroup a socket's records are counted against: its pod's. The programs count a
//! record against the creating process's cgroup ancestor at the pods' level
//! (`DatapathConfig::pod_level`), one level further down under a kubelet quality-of-service
//! tier, so all of a pod's containers share one count; a process outside the pods (a node
//! daemon) is counted against its ancestor at that level, or its own cgroup when it sits
//! higher.
//!
//! The kubelet's layouts, seen from the cgroup v2 root the programs are attached to:
//! - cgroupfs driver: `kubepods/pod<uid>/<container>` (Guaranteed) and
//!   `kubepods/{burstable,besteffort}/pod<uid>/<container>`;
//! - systemd driver: `kubepods.slice/kubepods-pod<uid>.slice/<container>.scope` and
//!   `kubepods.slice/kubepods-{burstable,besteffort}.slice/kubepods-…-pod<uid>.slice/…`;
//! - a `cgroupRoot` (kind's `/kubelet`): the same below it, `kubelet/kubepods/…` with cgroupfs,
//!   `kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/
//!   kubelet-kubepods-besteffort-pod<uid>.slice/…` with systemd;
//! - `--cgroups-per-qos=false`: no `kubepods` cgroup, the pods' cgroups (`pod<uid>`,
//!   `…-pod<uid>.slice`) directly below the cgroup root.
//!
//! So the kubelet's `kubepods` cgroup is looked for a few levels down (whatever its prefix), the
//! pods are one below it, and its `burstable` and `besteffort` children are the tiers; without
//! one, a cgroup named for a pod UID places the pods. Where the agent itself runs in a pod,
//! its own cgroup's path must agree (`own_pod_level`), or the layout is reported unplaced. A
//! tree where no pod can be placed is said loudly (`Placement::Unplaced`, with the reason):
//! then each child of the attached cgroup counts on its own, never the node as one.
use std::{
    io,
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
};

/// How deep below the attached cgroup the kubelet's `kubepods` cgroup is looked for.
const SEARCH_DEPTH: usize = 3;

/// Where pods are in the cgroup tree, as the programs need it, and how that was found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroups {
    /// The cgroup level (0: the root) of a pod's cgroup.
    pub level: u32,
    /// The cgroup ids of the quality-of-service tiers (0: none).
    pub tiers: [u64; 2],
    /// How the level was found.
    pub placement: Placement,
}

/// How the pods' level was found: what `/status` and the start log say.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "by")]
pub enum Placement {
    /// Below the kubelet's `kubepods` cgroup at this path (relative to the attached cgroup).
    Kubepods { kubepods: PathBuf },
    /// The kubelet runs without quality-of-service cgroups: a pod's cgroup (named for its UID) at this path.
    PodCgroup { example: PathBuf },
    /// No pod could be placed: each child of the attached cgroup counts on its own.
    #[default]
    Unplaced,
}

impl Placement {
    /// Why, in words, for the log and `/status`.
    pub fn reason(&self) -> String {
        match self {
            Self::Kubepods { kubepods } => format!(
                "pods are the children of the kubelet's {} (and of its burstable and besteffort tiers)",
                kubepods.display()
            ),
            Self::PodCgroup { example } => format!(
                "no kubepods cgroup (kubelet --cgroups-per-qos=false): pods are at the level of {}",
                example.display()
            ),
            Self::Unplaced => "no kubelet pod cgroup found below the attached cgroup: each of its children counts on its own (a node of pods counts per pod only once the kubelet's cgroups are there)".to_string(),
        }
    }

    /// Whether the pods' level is known.
    pub fn placed(&self) -> bool {
        !matches!(self, Self::Unplaced)
    }
}

/// Finds the pods under the attached cgroup `attach` (a directory of a cgroup v2 mount).
pub fn detect(attach: &Path) -> io::Result<PodCgroups> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    detect_in(&mountinfo, &attach.canonicalize()?, &own)
}

/// `detect`, with the mount table and this process's `/proc/self/cgroup` given.
fn detect_in(mountinfo: &str, attach: &Path, own_cgroup: &str) -> io::Result<PodCgroups> {
    let base = level_in(mountinfo, attach).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is on no cgroup2 mount", attach.display()),
        )
    })?;
    let found = if let Some(kubepods) = find_dir(attach, SEARCH_DEPTH, is_kubepods) {
        let depth = components(kubepods.strip_prefix(attach).unwrap_or(&kubepods));
        let mut tiers = [0u64; 2];
        let ids = std::fs::read_dir(&kubepods)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| is_tier(&e.file_name().to_string_lossy()))
            .filter_map(|e| e.metadata().ok().filter(std::fs::Metadata::is_dir))
            .map(|m| m.ino());
        for (slot, id) in tiers.iter_mut().zip(ids) {
            *slot = id;
        }
        PodCgroups {
            level: base + depth + 1,
            tiers,
            placement: Placement::Kubepods {
                kubepods: kubepods
                    .strip_prefix(attach)
                    .unwrap_or(&kubepods)
                    .to_path_buf(),
            },
        }
    } else if let Some(pod) = find_dir(attach, SEARCH_DEPTH + 1, is_pod) {
        let rel = pod.strip_prefix(attach).unwrap_or(&pod).to_path_buf();
        PodCgroups {
            level: base + components(&rel),
            tiers: [0, 0],
            placement: Placement::PodCgroup { example: rel },
        }
    } else {
        PodCgroups {
            level: base + 1,
            tiers: [0, 0],
            placement: Placement::Unplaced,
        }
    };
    // Where the agent runs in a pod itself, its own pod's level is known: it must agree.
    // (One level further down under a tier, as the programs count it.)
    if let Some((own, under_tier)) = own_pod_level(own_cgroup)
        && found.placement.placed()
        && own != found.level + u32::from(under_tier)
    {
        return Ok(PodCgroups {
            placement: Placement::Unplaced,
            ..found
        });
    }
    Ok(found)
}

/// The kubelet's top cgroup, whatever the driver and the `cgroupRoot`: `kubepods`,
/// `kubepods.slice`, or `<root>-kubepods.slice`.
fn is_kubepods(name: &str) -> bool {
    name == "kubepods" || name == "kubepods.slice" || name.ends_with("-kubepods.slice")
}

/// A quality-of-service tier below it.
fn is_tier(name: &str) -> bool {
    matches!(name, "burstable" | "besteffort")
        || name.ends_with("-burstable.slice")
        || name.ends_with("-besteffort.slice")
}

/// A pod's cgroup: `pod<uid>` (cgroupfs) or `…-pod<uid>.slice` (systemd), the UID a UUID (with
/// `_` for `-` under systemd).
fn is_pod(name: &str) -> bool {
    let name = name.strip_suffix(".slice").unwrap_or(name);
    let Some(at) = name.rfind("pod") else {
        return false;
    };
    let uid = &name[at + 3..];
    (at == 0 || name[..at].ends_with('-'))
        && uid.len() == 36
        && uid
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-' || c == '_')
}

/// The first directory, breadth first within `depth` levels below `root`, whose name `wanted`.
fn find_dir(root: &Path, depth: usize, wanted: fn(&str) -> bool) -> Option<PathBuf> {
    let mut level = vec![root.to_path_buf()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in &level {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut children: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            children.sort();
            if let Some(hit) = children
                .iter()
                .find(|p| p.file_name().is_some_and(|n| wanted(&n.to_string_lossy())))
            {
                return Some(hit.clone());
            }
            next.extend(children);
        }
        level = next;
    }
    None
}

/// The level of this process's pod's cgroup, when it runs in one (the component of its cgroup
/// v2 path, `0::/…` in `/proc/self/cgroup`, named for a pod UID, counted from the root), and
/// whether its parent is a quality-of-service tier.
fn own_pod_level(proc_self_cgroup: &str) -> Option<(u32, bool)> {
    let path = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let at = parts.iter().position(|p| is_pod(p))?;
    let under_tier = at > 0 && is_tier(parts[at - 1]);
    Some((u32::try_from(at + 1).unwrap_or(u32::MAX), under_tier))
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

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

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

    /// A tree of `dirs` in a fresh folder (the attached cgroup, mounted as a cgroup2 root),
    /// and what `detect_in` finds there, with `own` as this process's cgroup.
    fn detect_tree(dirs: &[&str], own: &str) -> (PodCgroups, tempfile::TempDir) {
        let root = tempfile::tempdir().expect("tempdir");
        for d in dirs {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let attach = root.path().canonicalize().expect("canonical");
        let mountinfo = format!("1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n", attach.display());
        (detect_in(&mountinfo, &attach, own).expect("detect"), root)
    }

    fn ino(root: &tempfile::TempDir, d: &str) -> u64 {
        std::fs::metadata(root.path().join(d))
            .expect("metadata")
            .ino()
    }

    #[test]
    fn every_kubelet_layout_puts_pods_below_kubepods_and_finds_the_tiers() {
        for (kubepods, burstable, besteffort, pod) in [
            // cgroupfs
            (
                "kubepods",
                "kubepods/burstable",
                "kubepods/besteffort",
                format!("kubepods/besteffort/pod{UID}/c1"),
            ),
            // systemd
            (
                "kubepods.slice",
                "kubepods.slice/kubepods-burstable.slice",
                "kubepods.slice/kubepods-besteffort.slice",
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/c1.scope",
                    UID.replace('-', "_")
                ),
            ),
            // kind: systemd with cgroupRoot /kubelet
            (
                "kubelet.slice/kubelet-kubepods.slice",
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
                format!(
                    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice/cri-containerd-1.scope",
                    UID.replace('-', "_")
                ),
            ),
            // cgroupfs with cgroupRoot /kubelet
            (
                "kubelet/kubepods",
                "kubelet/kubepods/burstable",
                "kubelet/kubepods/besteffort",
                format!("kubelet/kubepods/burstable/pod{UID}/c1"),
            ),
        ] {
            let (pods, root) =
                detect_tree(&[kubepods, burstable, besteffort, &pod, "system.slice"], "");
            let depth = kubepods.split('/').count() as u32;
            assert_eq!(pods.level, depth + 1, "{kubepods}");
            let mut tiers = pods.tiers;
            tiers.sort_unstable();
            let mut want = [ino(&root, burstable), ino(&root, besteffort)];
            want.sort_unstable();
            assert_eq!(tiers, want, "{kubepods}");
            assert_eq!(
                pods.placement,
                Placement::Kubepods {
                    kubepods: kubepods.into()
                },
                "{kubepods}"
            );
        }
    }

    #[test]
    fn without_qos_cgroups_a_pod_uid_places_the_pods() {
        let (pods, _root) = detect_tree(&[&format!("pod{UID}/c1"), "system.slice"], "");
        assert_eq!(pods.level, 1);
        assert_eq!(pods.tiers, [0, 0]);
        assert!(matches!(pods.placement, Placement::PodCgroup { .. }));
    }

    #[test]
    fn a_tree_without_pods_is_unplaced_and_counts_each_child() {
        let (pods, _root) = detect_tree(&["pod-a", "system.slice"], "");
        assert_eq!(pods.level, 1);
        assert_eq!(pods.placement, Placement::Unplaced);
        assert!(pods.placement.reason().contains("no kubelet pod cgroup"));
    }

    /// The agent's own pod, where it runs in one, is what is known: a detection that disagrees
    /// with it is not trusted.
    #[test]
    fn the_agents_own_pod_checks_the_level() {
        let pod = format!(
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice",
            UID.replace('-', "_")
        );
        let dirs = [
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
            pod.as_str(),
        ];
        let agrees = format!("0::/{pod}/cri-containerd-1.scope\n");
        let (pods, _root) = detect_tree(&dirs, &agrees);
        assert_eq!(pods.level, 3);
        assert!(pods.placement.placed());
        // A pod cgroup elsewhere than the tree says: not placed.
        let (pods, _root) = detect_tree(&dirs, &format!("0::/x/pod{UID}/c\n"));
        assert_eq!(pods.placement, Placement::Unplaced);
        assert_eq!(own_pod_level(&agrees), Some((4, true)));
    }

    #[test]
    fn pod_cgroups_are_named_for_a_uid() {
        assert!(is_pod(&format!("pod{UID}")));
        assert!(is_pod(&format!(
            "kubepods-besteffort-pod{}.slice",
            UID.replace('-', "_")
        )));
        assert!(!is_pod("pod-a"));
        assert!(!is_pod("podman.slice"));
    }
}
