//! The `nft` tool, as the outside path drives it: one transaction per change (`nft -f -`,
//! atomic: any error rejects all of it), listings for the drift check and for `inspect`, and the
//! checks a node needs before the mode runs (the tool and its version, no kube-proxy rules).
//! As kube-proxy's knftables: the tool, not hand-built netlink, and never `list ruleset`.
use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use crate::vocab::Family;

/// socklb's table, in the `ip` and the `ip6` family.
pub const TABLE: &str = "socklb";

/// The oldest `nft` the mode takes: older ones parse the whole ruleset and can fail on other
/// tables' newer constructs (kube-proxy requires the same).
const MIN_VERSION: (u32, u32, u32) = (1, 0, 1);

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "the nft tool was not found on PATH ({path}): the outside path (--external-traffic nftables) needs nftables (Debian: apt install nftables)"
    )]
    Missing { path: String },
    #[error("nft {version} is older than 1.0.1, which the outside path needs")]
    TooOld { version: String },
    #[error(
        "kube-proxy's rules are on this node ({what}): two proxies would rewrite the same traffic; remove kube-proxy before --external-traffic nftables"
    )]
    KubeProxy { what: String },
    #[error("running nft: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("nft refused the transaction: {stderr}")]
    Refused { stderr: String },
    #[error("nft's listing does not parse: {0}")]
    Listing(String),
}

/// The nftables family keyword of an address family.
pub const fn family_keyword(family: Family) -> &'static str {
    match family {
        Family::IPv4 => "ip",
        Family::IPv6 => "ip6",
    }
}

/// The `nft` tool.
#[derive(Clone, Debug)]
pub struct Nft {
    path: PathBuf,
}

impl Nft {
    /// Finds `nft` on PATH and checks its version.
    pub fn find() -> Result<Self, NftError> {
        let path_var = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::split_paths(&path_var)
            .map(|dir| dir.join("nft"))
            .find(|p| p.is_file())
            .ok_or_else(|| NftError::Missing {
                path: path_var.to_string_lossy().into_owned(),
            })?;
        let nft = Self { path };
        let out = nft.run(&["--version"], None)?;
        // "nftables v1.0.6 (Lester Gooch #5)"
        let version = out
            .split_whitespace()
            .find_map(|w| w.strip_prefix('v'))
            .unwrap_or_default()
            .to_string();
        let parsed: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        let triple = (
            parsed.first().copied().unwrap_or(0),
            parsed.get(1).copied().unwrap_or(0),
            parsed.get(2).copied().unwrap_or(0),
        );
        if triple < MIN_VERSION {
            return Err(NftError::TooOld { version });
        }
        Ok(nft)
    }

    /// Fails when kube-proxy's rules are on this node: its nftables table, or its iptables
    /// chains (iptables-nft shows them in `ip nat`).
    pub fn check_no_kube_proxy(&self) -> Result<(), NftError> {
        let tables = self.run(&["list", "tables"], None)?;
        for line in tables.lines() {
            let line = line.trim();
            if line == "table ip kube-proxy" || line == "table ip6 kube-proxy" {
                return Err(NftError::KubeProxy {
                    what: line.to_string(),
                });
            }
        }
        for family in ["ip", "ip6"] {
            if self
                .run(&["list", "chain", family, "nat", "KUBE-SERVICES"], None)
                .is_ok()
            {
                return Err(NftError::KubeProxy {
                    what: format!("chain KUBE-SERVICES in table {family} nat"),
                });
            }
        }
        Ok(())
    }

    /// Runs one transaction from `script` (`nft -f -`).
    pub fn apply(&self, script: &str) -> Result<(), NftError> {
        self.run(&["-f", "-"], Some(script)).map(|_| ())
    }

    /// Checks a transaction without committing it (`nft --check -f -`).
    pub fn check(&self, script: &str) -> Result<(), NftError> {
        self.run(&["--check", "-f", "-"], Some(script)).map(|_| ())
    }

    /// The table's text without set contents (`nft -t list table`), or `None` when there is no
    /// such table.
    pub fn list_terse(&self, family: Family) -> Result<Option<String>, NftError> {
        match self.run(
            &["-t", "list", "table", family_keyword(family), TABLE],
            None,
        ) {
            Ok(text) => Ok(Some(text)),
            Err(NftError::Refused { stderr }) if stderr.contains("No such file or directory") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The table as nft's JSON (`nft -j list table`), or `None` when there is no such table.
    pub fn list_json(&self, family: Family) -> Result<Option<serde_json::Value>, NftError> {
        match self.run(
            &["-j", "list", "table", family_keyword(family), TABLE],
            None,
        ) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| NftError::Listing(e.to_string())),
            Err(NftError::Refused { stderr }) if stderr.contains("No such file or directory") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes socklb's tables in both families; a table that is not there is no error.
    /// Returns how many were deleted.
    pub fn delete_tables(&self) -> Result<usize, NftError> {
        let mut deleted = 0;
        for family in [Family::IPv4, Family::IPv6] {
            if self.list_terse(family)?.is_some() {
                self.apply(&format!(
                    "delete table {} {TABLE}\n",
                    family_keyword(family)
                ))?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(NftError::Spawn)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A write error shows as nft's own failure below.
            let _ = pipe.write_all(text.as_bytes());
        }
        let out = child.wait_with_output().map_err(NftError::Spawn)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if stderr.len() > 2_000 {
                let mut cut = 2_000;
                while !stderr.is_char_boundary(cut) {
                    cut -= 1;
                }
                stderr.truncate(cut);
                stderr.push_str(" ...");
            }
            Err(NftError::Refused { stderr })
        }
    }
}
