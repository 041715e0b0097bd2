//! The processes a sandbox starts, tracked by PID until reaped, so a teardown (also from a
//! signal handler) ends exactly those and no other: an unreaped child's PID cannot be reused.
use std::{
    collections::BTreeSet,
    process::{Child, Command},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Pids>>);

/// The children, and whether the registry still takes new ones.
#[derive(Default)]
pub struct Pids {
    live: BTreeSet<u32>,
    closed: bool,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Pids> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The children still tracked.
    pub fn live(&self) -> Vec<u32> {
        self.lock().live.iter().copied().collect()
    }

    /// Starts `cmd` and tracks the child (refused once the registry is closed).
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<Owned> {
        let mut pids = self.lock();
        if pids.closed {
            return Err(std::io::Error::other("the sandbox is being torn down"));
        }
        let child = cmd.spawn()?;
        pids.live.insert(child.id());
        Ok(Owned {
            child: Some(child),
            registry: self.clone(),
        })
    }

    /// SIGKILLs every child still registered and waits (at most 2 s) until each has exited
    /// (a zombie, or reaped), so what it held (an agent's lock, its fds) is released before
    /// the caller cleans up after it.
    pub fn kill_all(&self) {
        let pids: Vec<u32> = self.lock().live.iter().copied().collect();
        // Our own unreaped children: their PIDs cannot have been reused.
        for pid in &pids {
            crate::system::sigkill(*pid);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while pids.iter().any(|pid| crate::system::running(*pid))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Registry {
    /// Takes no new children any more, then kills every one it has (see `kill_all`).
    pub fn close(&self) {
        self.lock().closed = true;
        self.kill_all();
    }
}

/// A child that is killed, reaped and forgotten when dropped.
pub struct Owned {
    child: Option<Child>,
    registry: Registry,
}

impl Owned {
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("child present until drop")
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Hold the registry while reaping, so kill_all never signals a reaped PID.
            let mut pids = self.registry.lock();
            let _ = child.kill();
            let _ = child.wait();
            pids.live.remove(&child.id());
        }
    }
}
