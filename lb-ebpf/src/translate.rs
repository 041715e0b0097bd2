//! The translation logic behind every hook. `try_translate` returns the hook's verdict or a
//! `Fault` that the entry point counts and turns into a verdict; `reverse` and `release` cannot
//! fail.
//!
//! The miss path (a destination that is no service) is array lookups only, in `may_be_service`,
//! inlined in the entry point: the frontend port bitmap (a bit per protocol and port, one word
//! that stays in the cache; a port no service uses ends there), then the frontend filter, a bit per
//! hashed service address and port (`lb_common::ports::frontend_bit`, shared with the agent). Only
//! a set bit in both (a service, or rarely another address whose hash collides) costs the
//! frontend lookup, in the hit path's function: `try_translate` runs in a BPF function of its own
//! per hook, so a miss runs only the entry point's instructions, with its exit beside them, and
//! code a miss does not touch stays out of its cache lines. getpeername and recvmsg check the
//! backend port bitmap in `PORTS` before they look at the socket's record.
//!
//! What the programs write. They read frontends and backends and never write them (nor `PORTS`,
//! `SERVICE_META`, `CONFIG` or `MONITOR`). What they write is per socket (`SOCKETS`, socket-local
//! storage freed with the socket; `CONNECTIONS`, a slot by socket cookie, taken at connect only
//! when free or already this socket's, and cleared by the release program only when it holds
//! this socket's cookie; `SLOTS_HELD`, the slot's byte, 1 after the cookie is written and 0
//! before it is cleared, so that close, getpeername and recvmsg read no slot for a socket whose
//! byte is 0), per pod (`SOCKET_QUOTA`, the count of its socket records), per client
//! cgroup (`AFFINITY`, a fixed-size table each, so one pod only ever evicts its own choices; a
//! Service's choices live in the bucket its id hashes to, so a connect searches
//! `AFFINITY_BUCKET` entries, not the table), per CPU (`COUNTERS`), or, only while a reader has
//! claimed the stream (`MONITOR.until_ns` in the future), a decision in `EVENTS` (`emit`,
//! `BPF_RB_NO_WAKEUP`: the reader drains on its own clock; a full buffer drops it, counted as
//! `EventsDropped`). While nobody reads, a decision costs one array load more.
//!
//! Verdicts. A frontend with `count == 0` refuses the connect with `ECONNREFUSED`; every lookup
//! that reaches a frontend ends in exactly one of the counters `Translations`, `NoBackend`,
//! `NoLocalBackend`, `RecordFailed`, `RecordQuota`, `Faults`.
//!
//! Where a socket's record goes. A translated UDP socket needs one, and so does a TCP one unless
//! `--tcp-peer-name backend` (`RECORD_TCP`). A connect (TCP, or UDP) takes its `CONNECTIONS` slot
//! (`cookie & SLOT_MASK`) when `CONFIG` sets `CONFIG_CONNECTION_SLOTS` and the slot is free or
//! already this socket's: no allocation. A TCP connection's slot is not counted; a UDP socket's
//! is charged to its pod (connected UDP sockets are free to make by the thousand), once, at the
//! connect that took it. Otherwise (the slot held by another live connection, no slots, or a
//! sendmsg: the sendmsg programs have no slot code) the record goes in socket storage (`SOCKETS`)
//! and is charged to the pod. recvmsg and getpeername look at the slot first. A socket that needs
//! a record and cannot get one fails with `ENOBUFS`, in that pod only: when its storage cannot be
//! created (`RecordFailed`), or when its pod already holds the bound `CONFIG` sets
//! (`--max-sockets-per-pod`; `RecordQuota`). It never goes on without a record (but for two
//! connections whose cookies share a slot, racing for it at the same moment).
//!
//! The per-pod bound is kept in the kernel, with or without an agent. A record in socket storage is
//! charged to the creating process's cgroup ancestor at `pod_level` (one level further under a
//! kubelet quality-of-service tier; its own cgroup when `pod_level` is 0 or it sits higher) with an
//! atomic add, and `release` takes it off that pod's count when the socket closes. It also frees
//! the socket's `CONNECTIONS` slot, taking a UDP slot off its pod's count too; every closing TCP
//! and UDP socket is looked at, since a failed connect, `connect(AF_UNSPEC)` or a connect elsewhere
//! leaves its slot unseen. The UDP iterator reports a socket's slot record with its storage's, and
//! the agent's recount counts both; it reports a UDP slot only while the socket's peer is on a
//! backend port, so a recount may leave such a pod's count one lower until the socket closes, which
//! only lets it through. The bound is approximate only by what CPUs add at the same moment.
//! `SOCKET_QUOTA` is an LRU read as signed: a count the LRU forgot starts again and may go below
//! zero as older sockets close, which only lets that pod through. With no bound configured nothing
//! is counted.
use aya_ebpf::{
    helpers::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_ktime_get_ns,
        generated::{
            bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_socket_cookie,
            bpf_set_retval,
        },
    },
    programs::{SockAddrContext, SockContext},
};
use aya_log_ebpf::debug;
use lb_common::{
    AFFINITY_BUCKET, AFFINITY_WAYS, AffinityEntry, Backend, CONFIG_CONNECTION_SLOTS,
    CONNECTION_SLOTS, ConnRecord, Counter, DatapathConfig, Event, FAMILY_IPV4,
    FRONTEND_FLAG_AFFINITY, FRONTEND_FLAG_NO_LOCAL, Frontend, Frontend4Key, FrontendKey,
    HOOK_CONNECT, HOOK_SENDMSG, PROTOCOL_TCP, PROTOCOL_UDP, SLOTS_PER_HELD, SOCK_DESTINATIONS,
    SockRecord, SockState, event, index, ports,
};

use crate::{
    maps::{
        AFFINITY, AFFINITY_EMPTY, BACKENDS, CONFIG, CONNECTIONS, EVENTS, FRONTEND_INDEX,
        FRONTEND_INDEX6, FRONTENDS4, FRONTENDS6, MONITOR, PORTS, SLOTS_HELD, SOCKET_QUOTA, SOCKETS,
        count,
    },
    proof,
    sockaddr::{self, SockAddr},
};

/// Hook return values.
pub(crate) const ALLOW: i32 = 1;
pub(crate) const REJECT: i32 = 0;

/// Map update flag: only create.
const BPF_NOEXIST: u64 = 1;
/// `bpf_ringbuf_output` flag: do not wake the reader.
const BPF_RB_NO_WAKEUP: u64 = 1;
const ECONNREFUSED: i32 = 111;
const EHOSTUNREACH: i32 = 113;
const ENOBUFS: i32 = 105;
const NANOS_PER_SECOND: u64 = 1_000_000_000;
/// The API's longest affinity timeout (one day): older entries are dead whatever their service.
/// Masks table indexes so the verifier sees them bounded.
const WAY_MASK: usize = AFFINITY_WAYS - 1;
/// Masks a socket cookie to its `CONNECTIONS` slot.
const SLOT_MASK: u32 = CONNECTION_SLOTS - 1;
/// A record index the verifier sees bounded (`SOCK_DESTINATIONS` need not be a power of two).
#[inline(always)]
const fn slot_of(i: usize) -> usize {
    if i < SOCK_DESTINATIONS { i } else { 0 }
}
const MAX_AFFINITY_NS: u64 = 86_400 * NANOS_PER_SECOND;

/// Whether TCP sockets get a record (so getpeername reports the service address). Set by the
/// agent at load time (`--tcp-peer-name`); UDP sockets always get one.
#[unsafe(no_mangle)]
static RECORD_TCP: u8 = 1;

/// The frontend index's copy of an IPv4 frontend, when its slot holds it whole.
#[inline(always)]
fn indexed(key: &Frontend4Key, config: Option<&DatapathConfig>) -> Option<Frontend> {
    let secret = config?.index_secret;
    let entry = FRONTEND_INDEX.get(index::slot(key, secret))?;
    // One copy, checked and then used: the agent may be rewriting the entry under us.
    // SAFETY: a map value the verifier bounds; copied by value.
    let entry = unsafe { core::ptr::read_volatile(entry) };
    entry.holds(key, secret).then_some(entry.frontend)
}

/// The same for an IPv6 frontend, from `FRONTEND_INDEX6`.
#[inline(always)]
fn indexed6(key: &FrontendKey, config: Option<&DatapathConfig>) -> Option<Frontend> {
    let secret = config?.index_secret;
    let entry = FRONTEND_INDEX6.get(index::slot6(key, secret))?;
    // SAFETY: as in `indexed`.
    let entry = unsafe { core::ptr::read_volatile(entry) };
    entry.holds(key, secret).then_some(entry.frontend)
}

/// Something the maps should never hold: a frontend whose range lies outside `BACKENDS`.
pub(crate) enum Fault {
    BackendOutOfRange,
}

/// Which hook translates: `connect()` picks a backend afresh (or by affinity); `sendmsg()` on an
/// unconnected UDP socket keeps the socket's previous backend while it is still in the service.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    Connect,
    SendMsg,
}

/// Which address family the socket itself has (an AF_INET6 socket may dial IPv4-mapped addresses).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketFamily {
    V4,
    V6,
}

struct Choice {
    /// Index within the backend set.
    slot: u32,
    backend: Backend,
    /// The socket's record already says so (a UDP socket reusing its backend).
    recorded: bool,
    /// How it was chosen (`event::TRANSLATED`, `AFFINITY` or `STICKY`).
    kind: u8,
}

/// connect4/6 and sendmsg4/6, the miss path: whether the destination may be a service (TCP or
/// UDP, a port some service uses, an address the frontend filter holds). The hook allows any
/// other destination untouched.
#[inline(always)]
pub(crate) fn may_be_service(ctx: &SockAddrContext, family: SocketFamily) -> bool {
    let dest = load(ctx, family);
    sockaddr::udp(ctx).is_some_and(|udp| maybe_frontend(udp, &dest))
}

/// connect4/6 and sendmsg4/6 past the miss path (`may_be_service`): a service address becomes
/// one of its backends. It reads the context again rather than take what the miss path read,
/// so that the destination's family stays a constant in the IPv4 programs.
#[inline(always)]
pub(crate) fn try_translate(
    ctx: &SockAddrContext,
    hook: Hook,
    family: SocketFamily,
) -> Result<i32, Fault> {
    let dest = load(ctx, family);
    let Some(udp) = sockaddr::udp(ctx) else {
        return Ok(ALLOW);
    };
    let protocol = if udp { PROTOCOL_UDP } else { PROTOCOL_TCP };
    let key = FrontendKey {
        addr: dest.addr,
        port_be: dest.port_be,
        protocol,
        family: dest.family,
    };
    let config = CONFIG.get(0);
    let frontend = if dest.family == FAMILY_IPV4 {
        let key4 = key.v4();
        // SAFETY: the value is copied out at once; the agent replaces frontends whole.
        indexed(&key4, config).or_else(|| unsafe { FRONTENDS4.get(key4).copied() })
    } else {
        // SAFETY: as above.
        indexed6(&key, config).or_else(|| unsafe { FRONTENDS6.get(key).copied() })
    };
    let Some(frontend) = frontend else {
        return Ok(ALLOW);
    };

    if frontend.count == 0 {
        let kind = if frontend.flags & FRONTEND_FLAG_NO_LOCAL != 0 {
            count(Counter::NoLocalBackend);
            event::NO_LOCAL_BACKEND
        } else {
            count(Counter::NoBackend);
            event::NO_BACKEND
        };
        emit(hook, kind, &key, &Backend::default(), frontend.service_id);
        debug!(ctx, "service {} has no usable backend", frontend.service_id);
        return Ok(refuse(ECONNREFUSED));
    }
    let wants_record = udp || read_flag(&RECORD_TCP);
    // A connect's record (TCP, or a connected UDP socket) goes in the socket's `CONNECTIONS`
    // slot when that is free (no allocation); otherwise, and at sendmsg (an unconnected UDP
    // socket; the sendmsg programs have no slot code), in the socket's own storage.
    let (slot, cookie, held) = if wants_record && hook == Hook::Connect && slots_on(config) {
        connection_slot(ctx)
    } else {
        (core::ptr::null_mut(), 0, false)
    };
    // Whom the record is listed under: for a TCP connection the process's cgroup; a connected
    // UDP socket's slot counts against its pod's bound as a record in storage does (thousands
    // cost a pod nothing to make, unlike TCP connections), so it names the pod charged.
    let (mut owner, charged) = if udp && !slot.is_null() {
        if let Some(taken) = charge_udp_slot(slot, held, config) {
            taken
        } else {
            count(Counter::RecordQuota);
            emit(
                hook,
                event::RECORD_QUOTA,
                &key,
                &Backend::default(),
                frontend.service_id,
            );
            return Ok(refuse(ENOBUFS));
        }
    } else {
        (0, None)
    };
    let mut state = core::ptr::null_mut::<SockState>();
    if wants_record && slot.is_null() {
        state = match socket_state(ctx, config) {
            Ok(state) => state,
            Err(kind) => {
                emit(hook, kind, &key, &Backend::default(), frontend.service_id);
                return Ok(refuse(ENOBUFS));
            }
        };
    }
    let choice = match choose(ctx, hook, &key, &frontend, state) {
        Ok(choice) => choice,
        Err(fault) => {
            // The slot is not taken, so no release will give the charge back: give it now.
            if let Some(max) = charged {
                uncharge(owner, max);
            }
            return Err(fault);
        }
    };
    if !slot.is_null() {
        if !udp {
            // SAFETY: plain helper call.
            owner = unsafe { bpf_get_current_cgroup_id() };
        }
        take_slot(slot, cookie, owner, &key, &choice, frontend.service_id);
        set_held(cookie, 1);
    } else if wants_record && !choice.recorded {
        remember(state, &key, &choice, frontend.service_id);
    }
    let b = &choice.backend;
    store(ctx, family, &b.addr, b.port_be, b.family);
    count(Counter::Translations);
    emit(hook, choice.kind, &key, b, frontend.service_id);
    debug!(
        ctx,
        "service {} slot {} -> backend", frontend.service_id, choice.slot
    );
    Ok(ALLOW)
}

/// getpeername4/6 and recvmsg4/6: a socket that was translated reports the service address as
/// its peer, as it would behind a NAT-based proxy.
#[inline(always)]
pub(crate) fn reverse(ctx: &SockAddrContext, family: SocketFamily) -> i32 {
    if proof::never_met_addr(ctx) {
        return ALLOW;
    }
    let peer = load(ctx, family);
    let udp = sockaddr::udp(ctx) == Some(true);
    if !backend_port_in_use(udp, peer.port_be) {
        return ALLOW;
    }
    if slots_on(CONFIG.get(0)) {
        // SAFETY: the hook's own socket.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
        if may_hold_slot(cookie)
            && let Some(slot) = CONNECTIONS.get(cookie as u32 & SLOT_MASK)
            && slot.cookie == cookie
            && same_backend(&slot.backend, &peer)
        {
            let frontend = &slot.frontend;
            store(
                ctx,
                family,
                &frontend.addr,
                frontend.port_be,
                frontend.family,
            );
            count(Counter::ReverseTranslations);
            return ALLOW;
        }
    }
    // SAFETY: this socket's own storage, or null.
    let state = unsafe { SOCKETS.get_ptr_mut(ctx) };
    if state.is_null() {
        return ALLOW;
    }
    for i in 0..SOCK_DESTINATIONS {
        // SAFETY: non-null, `i` masked below the array's length; only hooks of this socket
        // write it, and a torn read only fails the comparison.
        let record = unsafe { &*core::ptr::addr_of!((*state).records[slot_of(i)]) };
        if same_backend(&record.backend, &peer) {
            let frontend = &record.frontend;
            store(
                ctx,
                family,
                &frontend.addr,
                frontend.port_be,
                frontend.family,
            );
            count(Counter::ReverseTranslations);
            break;
        }
    }
    ALLOW
}

/// Writes a decision to `EVENTS` while `socklb monitor` reads them; nothing else (one array
/// load) while nobody does. A full ring buffer drops the decision, counted.
#[inline(always)]
fn emit(hook: Hook, kind: u8, key: &FrontendKey, backend: &Backend, service_id: u32) {
    let Some(monitor) = MONITOR.get(0) else {
        return;
    };
    let until = monitor.until_ns;
    if until == 0 {
        return;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if now >= until {
        return;
    }
    let event = Event {
        at_ns: now,
        // SAFETY: plain helper call.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        frontend: *key,
        backend: *backend,
        service_id,
        kind,
        hook: match hook {
            Hook::Connect => HOOK_CONNECT,
            Hook::SendMsg => HOOK_SENDMSG,
        },
        _pad: [0; 2],
    };
    // No wakeup: the reader drains the buffer on its own clock (a wakeup per decision would
    // cost the connect microseconds).
    if EVENTS.output(event, BPF_RB_NO_WAKEUP).is_err() {
        count(Counter::EventsDropped);
    }
}

/// Whether TCP connections take `CONNECTIONS` slots (the release program frees them).
#[inline(always)]
fn slots_on(config: Option<&DatapathConfig>) -> bool {
    config.is_some_and(|c| c.flags & CONFIG_CONNECTION_SLOTS != 0)
}

#[inline(always)]
fn same_backend(backend: &Backend, peer: &SockAddr) -> bool {
    backend.family == peer.family && backend.port_be == peer.port_be && backend.addr == peer.addr
}

/// The socket's state, created on its first translation and counted against its pod's bound.
/// `Err` says why the call is refused (ENOBUFS, `event::*`): past the bound, or when the
/// kernel cannot allocate the storage.
#[inline(always)]
fn socket_state(
    ctx: &SockAddrContext,
    config: Option<&DatapathConfig>,
) -> Result<*mut SockState, u8> {
    // SAFETY: this socket's own storage, or null.
    let state = unsafe { SOCKETS.get_ptr_mut(ctx) };
    if !state.is_null() {
        // A record programs before the cookie proof made has no cookie: made now, its
        // replies are looked for (the proof's check costs no helper when the cookie exists).
        if proof::never_met_addr(ctx) {
            // SAFETY: the hook's own socket.
            unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
        }
        return Ok(state);
    }
    let (pod, max) = pod_bound(config);
    if !charge(pod, max) {
        count(Counter::RecordQuota);
        return Err(event::RECORD_QUOTA);
    }
    // The cookie before the record: a socket with a record is never one whose cookie is unmade
    // (`proof`), so its close and recvmsg look for the record.
    // SAFETY: the hook's own socket.
    unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    // SAFETY: the socket is the hook's own; the helper returns its storage or null.
    let state = unsafe { SOCKETS.get_or_insert_ptr_mut(ctx, None) };
    if state.is_null() {
        // No record, so no release will take it off the count: take it off now.
        uncharge(pod, max);
        count(Counter::RecordFailed);
        return Err(event::RECORD_FAILED);
    }
    // SAFETY: non-null; a new value is all zero and only this socket's hooks write it.
    unsafe {
        (*state).cgroup_id = pod;
        (*state).created_ns = coarse_now();
    }
    Ok(state)
}

/// Whom a connected UDP socket's slot is listed under (its pod, charged as a record in storage
/// would be) and, for a slot this connect takes, the bound the pod was charged against, to give
/// back if the connect fails before the slot is written; `None`: the pod is at its bound.
#[inline(always)]
fn charge_udp_slot(
    slot: *mut ConnRecord,
    held: bool,
    config: Option<&DatapathConfig>,
) -> Option<(u64, Option<u64>)> {
    if held {
        // SAFETY: this socket's own slot (its cookie), charged when it was taken.
        return Some((unsafe { (*slot).cgroup_id }, None));
    }
    let (pod, max) = pod_bound(config);
    charge(pod, max).then_some((pod, Some(max)))
}

/// The calling process's pod and the bound on its records.
#[inline(always)]
fn pod_bound(config: Option<&DatapathConfig>) -> (u64, u64) {
    match config {
        Some(c) => (pod_of(c), c.max_sockets_per_pod),
        // SAFETY: plain helper call.
        None => (unsafe { bpf_get_current_cgroup_id() }, u64::MAX),
    }
}

/// The pod the calling process belongs to: its cgroup's ancestor at the pods' level (one level
/// further under a kubelet quality-of-service tier), or its own cgroup outside pods.
#[inline(always)]
fn pod_of(config: &DatapathConfig) -> u64 {
    // SAFETY: plain helper calls.
    unsafe {
        let own = bpf_get_current_cgroup_id();
        let level = config.pod_level.cast_signed();
        if level == 0 {
            return own;
        }
        let mut pod = bpf_get_current_ancestor_cgroup_id(level);
        if pod != 0 && (pod == config.tiers[0] || pod == config.tiers[1]) {
            pod = bpf_get_current_ancestor_cgroup_id(level + 1);
        }
        if pod == 0 { own } else { pod }
    }
}

/// Counts one more socket record for `pod`; false when it already holds `max`. No bound
/// configured: nothing is counted (and nothing is taken off at release).
#[inline(always)]
fn charge(pod: u64, max: u64) -> bool {
    if unbounded(max) {
        return true;
    }
    let held = if let Some(held) = SOCKET_QUOTA.get_ptr_mut(pod) {
        held
    } else {
        let _ = SOCKET_QUOTA.insert(pod, 0, BPF_NOEXIST);
        match SOCKET_QUOTA.get_ptr_mut(pod) {
            Some(held) => held,
            // The LRU could not make room (only under extreme pressure): do not refuse.
            None => return true,
        }
    };
    // SAFETY: a value of the map, valid while this program runs. The add is atomic (BPF's
    // atomic add; the target has no compare-exchange, so core's atomics lack `fetch_add`):
    // other CPUs count the same pod. A concurrent check may let a few more through; the bound
    // is approximate by that much. Signed: see `SOCKET_QUOTA`.
    unsafe {
        if core::ptr::read_volatile(held).cast_signed() >= max.cast_signed() {
            return false;
        }
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            held, 1,
        );
    }
    true
}

/// No bound: `u64::MAX`, or 0 (an entry never written).
#[inline(always)]
fn unbounded(max: u64) -> bool {
    max == u64::MAX || max == 0
}

/// Takes one record off `pod`'s count.
#[inline(always)]
fn uncharge(pod: u64, max: u64) {
    if unbounded(max) {
        return;
    }
    if let Some(held) = SOCKET_QUOTA.get_ptr_mut(pod) {
        // SAFETY: as in `charge`; adding 2^64 - 1 subtracts one.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                held,
                u64::MAX,
            );
        }
    }
}

/// The socket's cookie and its `CONNECTIONS` slot when that is free or already the socket's
/// own (then `true`); a null slot when another live connection holds it.
#[inline(always)]
fn connection_slot(ctx: &SockAddrContext) -> (*mut ConnRecord, u64, bool) {
    // SAFETY: the hook's own socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    if let Some(s) = CONNECTIONS.get_ptr_mut(cookie as u32 & SLOT_MASK) {
        // SAFETY: a value of the array, valid while this program runs.
        let holder = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*s).cookie)) };
        if holder == 0 || holder == cookie {
            return (s, cookie, holder == cookie);
        }
    }
    (core::ptr::null_mut(), cookie, false)
}

/// The `SLOTS_HELD` byte of the slot of `cookie`.
#[inline(always)]
fn held_byte(cookie: u64) -> Option<*mut u8> {
    let slot = cookie as u32 & SLOT_MASK;
    let entry = SLOTS_HELD.get_ptr_mut(slot / SLOTS_PER_HELD)?;
    // SAFETY: a value of the array; the index is below its length.
    Some(unsafe {
        core::ptr::addr_of_mut!((*entry).held[(slot % SLOTS_PER_HELD) as usize]).cast::<u8>()
    })
}

/// Whether a socket with this cookie may hold its slot: false when its slot's byte is 0, so
/// that a socket that never took a slot reads no slot (true when the byte cannot be read).
#[inline(always)]
fn may_hold_slot(cookie: u64) -> bool {
    // SAFETY: a byte of the array, read once.
    held_byte(cookie).is_none_or(|b| unsafe { core::ptr::read_volatile(b) } != 0)
}

/// Writes the slot's byte: 1 after its cookie at connect, 0 before it at close, by the one
/// socket that holds the slot.
#[inline(always)]
fn set_held(cookie: u64, value: u8) {
    if let Some(b) = held_byte(cookie) {
        // SAFETY: a byte of the array; a byte store tears nothing.
        unsafe { core::ptr::write_volatile(b, value) };
    }
}

/// The clock of what the agent compares with now: when a record is made (its age, the agent's
/// counts) and when an affinity choice was last used (its timeout, `inspect affinity`'s idle
/// time). `CLOCK_MONOTONIC_COARSE`, the kernel's last tick, which the agent reads for the same
/// purposes (`sys::record_clock_now`), so that a record stamped before a count began was made
/// before it. The precise clock's read waits for the connect's loads still in flight: it cost a
/// hot TCP hit about a tenth, a connected UDP socket's connect about a fifth, and a hit of a
/// service with sessionAffinity about a sixth.
#[inline(always)]
fn coarse_now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns() }
}

/// Writes a connection's record in its slot, the cookie last (readers match on it).
#[inline(always)]
fn take_slot(
    slot: *mut ConnRecord,
    cookie: u64,
    cgroup_id: u64,
    key: &FrontendKey,
    choice: &Choice,
    service_id: u32,
) {
    // SAFETY: a value of the array, valid while this program runs; another connection racing
    // for the same slot (cookies equal in their low bits, at the same moment) can only make
    // this one's getpeername report its backend.
    unsafe {
        (*slot).cgroup_id = cgroup_id;
        (*slot).created_ns = coarse_now();
        (*slot).frontend = *key;
        (*slot).backend = choice.backend;
        (*slot).service_id = service_id;
        (*slot).slot = choice.slot;
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).cookie), cookie);
    }
}

/// `cgroup/sock_release`: a closing socket's record comes off its pod's count, and a
/// connected socket frees its slot. Runs for every socket closed in the cgroup tree; a TCP or
/// UDP socket that was never translated costs a storage lookup that finds nothing, its cookie
/// and its slot's byte in `SLOTS_HELD` (the slot itself only when another socket holds it).
#[inline(always)]
pub(crate) fn release(ctx: &SockContext) -> i32 {
    use aya_ebpf::helpers::generated::bpf_sk_storage_get;
    if proof::never_met(ctx) {
        return ALLOW;
    }
    let sk = ctx.sock;
    // SAFETY: the kernel's socket, the program's context.
    let Some(udp) = sockaddr::transport(unsafe { (*sk).protocol }) else {
        return ALLOW;
    };
    let config = CONFIG.get(0);
    let max = config.map_or(u64::MAX, |c| c.max_sockets_per_pod);
    // SAFETY: the helper returns the socket's value in `SOCKETS` or null.
    let state = unsafe {
        let map = core::ptr::from_ref(&SOCKETS).cast_mut().cast();
        bpf_sk_storage_get(map, sk.cast(), core::ptr::null_mut(), 0).cast::<SockState>()
    };
    if !state.is_null() {
        // SAFETY: non-null, this socket's value.
        uncharge(unsafe { (*state).cgroup_id }, max);
    }
    // Any TCP or UDP socket may hold a slot, whatever its peer now: the connect hook took it
    // before the kernel's connect, which can then fail and clear the peer (no route, no local
    // port, a blocking connect refused or timed out), and a socket disconnected with
    // `connect(AF_UNSPEC)`, which no hook sees, can connect again anywhere (a TCP socket to a
    // port no backend uses, a UDP socket to an address no service has) and close from there.
    // Looking only at peers on backend ports let such a socket keep its slot for ever, and any
    // pod could fill the table that way, one slot per socket.
    if slots_on(config) {
        // SAFETY: the program's own socket.
        let cookie = unsafe { bpf_get_socket_cookie(sk.cast()) };
        if may_hold_slot(cookie)
            && let Some(slot) = CONNECTIONS.get_ptr_mut(cookie as u32 & SLOT_MASK)
        {
            // SAFETY: a value of the array; only a matching cookie is cleared.
            unsafe {
                if core::ptr::read_volatile(core::ptr::addr_of!((*slot).cookie)) == cookie {
                    let pod = (*slot).cgroup_id;
                    // The byte first: a connect that takes the slot once its cookie reads 0
                    // writes its 1 after this 0.
                    set_held(cookie, 0);
                    core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).cookie), 0);
                    if udp {
                        uncharge(pod, max);
                    }
                }
            }
        }
    }
    ALLOW
}

/// Records the choice in the socket's state: in the record of the same service address, else
/// a free one, else the one whose turn it is.
#[inline(always)]
fn remember(state: *mut SockState, key: &FrontendKey, choice: &Choice, service_id: u32) {
    let mut index = SOCK_DESTINATIONS;
    let mut free = SOCK_DESTINATIONS;
    for i in 0..SOCK_DESTINATIONS {
        // SAFETY: `state` is non-null (callers pass it only with a record wanted) and `i` masked.
        let record = unsafe { &*core::ptr::addr_of!((*state).records[slot_of(i)]) };
        if record.frontend == *key {
            index = i;
            break;
        }
        if free == SOCK_DESTINATIONS && record.frontend.family == 0 {
            free = i;
        }
    }
    if index == SOCK_DESTINATIONS {
        index = if free < SOCK_DESTINATIONS {
            free
        } else {
            // SAFETY: as above.
            // (A comparison, not a modulo: the verifier must see the index bounded.)
            unsafe {
                let next = slot_of((*state).next as usize);
                (*state).next = if next + 1 < SOCK_DESTINATIONS {
                    next as u32 + 1
                } else {
                    0
                };
                next
            }
        };
    }
    // SAFETY: as above; the storage belongs to this socket, which cannot be released while
    // this hook runs.
    unsafe {
        *core::ptr::addr_of_mut!((*state).records[slot_of(index)]) = SockRecord {
            frontend: *key,
            backend: choice.backend,
            service_id,
            slot: choice.slot,
        };
    }
}

#[inline(always)]
fn read_flag(flag: &u8) -> bool {
    // SAFETY: a .rodata global the loader may override; read it as the verifier sees it.
    unsafe { core::ptr::read_volatile(flag) != 0 }
}

/// Whether some frontend uses `dest`'s port and the frontend filter has `dest`'s bit: false
/// means no service has this address.
#[inline(always)]
fn maybe_frontend(udp: bool, dest: &SockAddr) -> bool {
    let port = u16::from_be(dest.port_be);
    if !word_has(ports::frontend_port_word(udp, port), u32::from(port)) {
        return false;
    }
    let index = ports::frontend_bit(&dest.addr, dest.port_be);
    word_has(ports::frontend_word(udp, index), index)
}

/// Whether some backend uses `port_be` with this protocol.
#[inline(always)]
fn backend_port_in_use(udp: bool, port_be: u16) -> bool {
    let port = u16::from_be(port_be);
    word_has(ports::backend_word(udp, port), u32::from(port))
}

#[inline(always)]
fn word_has(word: u32, index: u32) -> bool {
    match PORTS.get(word) {
        Some(bits) => *bits & ports::bit(index) != 0,
        // The array has every word; a missing one would be a bug: do not skip the lookup.
        None => true,
    }
}

#[inline(always)]
fn load(ctx: &SockAddrContext, family: SocketFamily) -> SockAddr {
    match family {
        SocketFamily::V4 => sockaddr::load_v4(ctx),
        SocketFamily::V6 => sockaddr::load_v6(ctx),
    }
}

#[inline(always)]
fn store(
    ctx: &SockAddrContext,
    family: SocketFamily,
    addr: &[u32; 4],
    port_be: u16,
    addr_family: u8,
) {
    match family {
        SocketFamily::V4 => sockaddr::store_v4(ctx, addr, port_be),
        SocketFamily::V6 => sockaddr::store_v6(ctx, addr, port_be, addr_family),
    }
}

/// Sets the errno the rejected call returns and rejects it.
#[inline(always)]
fn refuse(errno: i32) -> i32 {
    // SAFETY: bpf_set_retval is allowed in connect and sendmsg hooks (kernel 5.18+).
    unsafe { bpf_set_retval(-errno) };
    REJECT
}

/// Turns a fault into the hook's verdict: count it and refuse with EHOSTUNREACH, so the client
/// fails fast and no packet goes to the virtual address.
#[inline(always)]
pub(crate) fn fault_verdict(fault: &Fault) -> i32 {
    count(Counter::Faults);
    match fault {
        Fault::BackendOutOfRange => refuse(EHOSTUNREACH),
    }
}

/// The backend at `slot` of the frontend's set.
#[inline(always)]
fn backend_at(frontend: &Frontend, slot: u32) -> Result<Backend, Fault> {
    BACKENDS
        .get(frontend.base.wrapping_add(slot))
        .copied()
        .ok_or(Fault::BackendOutOfRange)
}

/// True while `slot` is within the frontend's count and still holds `backend`.
#[inline(always)]
fn slot_holds(frontend: &Frontend, slot: u32, backend: &Backend) -> bool {
    slot < u32::from(frontend.count)
        && matches!(BACKENDS.get(frontend.base.wrapping_add(slot)), Some(b) if b == backend)
}

#[inline(always)]
fn choose(
    ctx: &SockAddrContext,
    hook: Hook,
    key: &FrontendKey,
    frontend: &Frontend,
    state: *mut SockState,
) -> Result<Choice, Fault> {
    if frontend.flags & FRONTEND_FLAG_AFFINITY != 0 {
        return choose_with_affinity(ctx, frontend);
    }
    if hook == Hook::SendMsg && !state.is_null() {
        for i in 0..SOCK_DESTINATIONS {
            // SAFETY: this socket's own state (non-null), `i` masked; the record is read in
            // place and its backend copied only on a hit.
            let previous = unsafe { &*core::ptr::addr_of!((*state).records[slot_of(i)]) };
            if previous.frontend == *key {
                if previous.service_id == frontend.service_id
                    && slot_holds(frontend, previous.slot, &previous.backend)
                {
                    count(Counter::StickyHits);
                    return Ok(Choice {
                        slot: previous.slot,
                        backend: previous.backend,
                        recorded: true,
                        kind: event::STICKY,
                    });
                }
                break;
            }
        }
    }
    choose_random(frontend)
}

#[inline(always)]
fn choose_random(frontend: &Frontend) -> Result<Choice, Fault> {
    // SAFETY: plain helper call.
    let random = unsafe { bpf_get_prandom_u32() };
    // Multiply-shift: uniform in 0..count without a division.
    let slot = ((u64::from(random) * u64::from(frontend.count)) >> 32) as u32;
    Ok(Choice {
        slot,
        backend: backend_at(frontend, slot)?,
        recorded: false,
        kind: event::TRANSLATED,
    })
}

/// The first entry of a service's bucket in a client's affinity table.
#[inline(always)]
fn bucket_of(service_id: u32) -> usize {
    // Fibonacci hashing: the top bits of the product pick the bucket.
    let buckets = (AFFINITY_WAYS / AFFINITY_BUCKET) as u32;
    let bucket = service_id.wrapping_mul(0x9e37_79b1) >> (32 - buckets.trailing_zeros());
    (bucket as usize * AFFINITY_BUCKET) & WAY_MASK
}

/// sessionAffinity ClientIP: the client (pod network namespace) of this backend set keeps its
/// backend while it stays and was used less than the timeout ago. The choices live in a table of
/// fixed size per client cgroup, so a client that uses many services only replaces its own.
#[inline(always)]
fn choose_with_affinity(ctx: &SockAddrContext, frontend: &Frontend) -> Result<Choice, Fault> {
    // SAFETY: helpers available to cgroup sock_addr programs.
    let (cgroup, netns, now) = unsafe {
        (
            bpf_get_current_cgroup_id(),
            bpf_get_netns_cookie(ctx.sock_addr.cast()),
            coarse_now(),
        )
    };
    let table = if let Some(t) = AFFINITY.get_ptr_mut(cgroup) {
        t
    } else {
        // A new client: an empty table (the LRU drops the least recently used client's table
        // only when there are more clients than the map holds).
        let Some(empty) = AFFINITY_EMPTY.get(0) else {
            return choose_random(frontend);
        };
        let _ = AFFINITY.insert(cgroup, empty, BPF_NOEXIST);
        let Some(t) = AFFINITY.get_ptr_mut(cgroup) else {
            return choose_random(frontend);
        };
        t
    };
    let timeout = u64::from(frontend.affinity_timeout_s) * NANOS_PER_SECOND;
    // The service's bucket of the client's table (set-associative: a client's choices for
    // services of other buckets never compete with these).
    let first = bucket_of(frontend.service_id);
    let mut found = AFFINITY_WAYS;
    // Where a new choice goes: a free or dead entry first, else the bucket's least recently
    // used one (an eviction, counted).
    let mut victim = first;
    let mut victim_age = 0u64;
    let mut victim_live = true;
    for way in 0..AFFINITY_BUCKET {
        let i = first + way;
        // SAFETY: `i` masked below AFFINITY_WAYS, inside the table the map lookup returned;
        // concurrent writers from the same client only make a choice fail validation.
        let entry = unsafe { &*core::ptr::addr_of!((*table).entries[i & WAY_MASK]) };
        if entry.service_id == frontend.service_id && entry.netns_cookie == netns {
            found = i;
            break;
        }
        let age = now.saturating_sub(entry.last_used_ns);
        if entry.service_id == 0 || age > MAX_AFFINITY_NS {
            if victim_live {
                victim = i;
                victim_live = false;
            }
        } else if victim_live && age >= victim_age {
            victim = i;
            victim_age = age;
        }
    }
    if found < AFFINITY_WAYS {
        // SAFETY: as above, `found` < AFFINITY_WAYS.
        let entry = unsafe { &mut *core::ptr::addr_of_mut!((*table).entries[found & WAY_MASK]) };
        if now.saturating_sub(entry.last_used_ns) <= timeout
            && slot_holds(frontend, entry.slot, &entry.backend)
        {
            entry.last_used_ns = now;
            count(Counter::AffinityHits);
            return Ok(Choice {
                slot: entry.slot,
                backend: entry.backend,
                recorded: false,
                kind: event::AFFINITY,
            });
        }
        victim = found;
        victim_live = false;
    }
    let choice = choose_random(frontend)?;
    if victim_live {
        count(Counter::AffinityEvictions);
    }
    // SAFETY: `victim` < AFFINITY_WAYS.
    unsafe {
        *core::ptr::addr_of_mut!((*table).entries[victim & WAY_MASK]) = AffinityEntry {
            netns_cookie: netns,
            last_used_ns: now,
            backend: choice.backend,
            service_id: frontend.service_id,
            slot: choice.slot,
            _pad: 0,
        };
    }
    Ok(choice)
}

/// The `SOCKETS` iterator's step: writes (cookie, state) for one socket.
#[inline(always)]
pub(crate) fn write_socket_entry(ctx: *mut crate::programs::SkStorageIterCtx) -> i32 {
    // SAFETY: the kernel hands the iterator a valid context; the pointers in it may be null
    // (the end of the walk), which is checked before use.
    unsafe {
        let ctx = &*ctx;
        write_entry(ctx.seq(), ctx.sk_ptr(), ctx.value_ptr());
    }
    0
}

/// The UDP iterator's step (one network namespace's UDP sockets): writes (cookie, addresses,
/// state) for a socket with a record, in its `SOCKETS` value, its `CONNECTIONS` slot or both.
#[inline(always)]
pub(crate) fn write_udp_entry(ctx: *mut crate::programs::UdpIterCtx) -> i32 {
    use aya_ebpf::helpers::generated::{bpf_get_socket_cookie, bpf_seq_write, bpf_sk_storage_get};
    // SAFETY: as above; the helper returns the socket's value in `SOCKETS` or null, and takes a
    // null socket.
    unsafe {
        let ctx = &*ctx;
        let sk = ctx.sk_ptr();
        if sk.is_null() {
            return 0;
        }
        let map = core::ptr::from_ref(&SOCKETS).cast_mut().cast();
        let value = bpf_sk_storage_get(map, sk, core::ptr::null_mut(), 0).cast::<SockState>();
        let mut addrs = sock_addrs(sk);
        if !value.is_null() {
            addrs.holds = lb_common::HOLDS_STORAGE;
        }
        // A connected socket's record may be in its `CONNECTIONS` slot (only one connected to a
        // backend port can hold one).
        // The cookie is asked for only here or once a record is found (a socket nobody asked
        // before gets one made).
        let mut cookie = 0;
        let slot = if addrs.peer_port_be != 0 && backend_port_in_use(true, addrs.peer_port_be) {
            cookie = bpf_get_socket_cookie(sk);
            CONNECTIONS
                .get(cookie as u32 & SLOT_MASK)
                .filter(|s| s.cookie == cookie)
        } else {
            None
        };
        if value.is_null() && slot.is_none() {
            return 0;
        }
        if cookie == 0 {
            cookie = bpf_get_socket_cookie(sk);
        }
        let mut state = if value.is_null() {
            SockState::default()
        } else {
            *value
        };
        if let Some(slot) = slot {
            with_slot_record(&mut state, slot);
            addrs.holds |= lb_common::HOLDS_SLOT;
        }
        let entry = lb_common::UdpSocketEntry {
            cookie,
            addrs,
            state,
        };
        bpf_seq_write(
            ctx.seq().cast(),
            core::ptr::from_ref(&entry).cast_mut().cast(),
            size_of::<lb_common::UdpSocketEntry>() as u32,
        );
    }
    0
}

/// Adds a slot's record to a socket's state: over the record of the same service address,
/// else in a free one, else over the first (the slot's is the socket's connection).
#[inline(always)]
fn with_slot_record(state: &mut SockState, slot: &ConnRecord) {
    let mut index = SOCK_DESTINATIONS;
    for i in 0..SOCK_DESTINATIONS {
        let frontend = &state.records[slot_of(i)].frontend;
        if *frontend == slot.frontend || (index == SOCK_DESTINATIONS && frontend.family == 0) {
            index = i;
            if *frontend == slot.frontend {
                break;
            }
        }
    }
    if state.cgroup_id == 0 {
        state.cgroup_id = slot.cgroup_id;
        state.created_ns = slot.created_ns;
    }
    state.records[slot_of(index)] = SockRecord {
        frontend: slot.frontend,
        backend: slot.backend,
        service_id: slot.service_id,
        slot: slot.slot,
    };
}

/// The start of `struct sock_common` (which starts `struct sock`, `struct inet_sock` and
/// `struct udp_sock`), a layout the kernel has kept since 2.6: the IPv4 address pair, the hash,
/// the port pair, the family and the state (the kernel's `skc_` fields).
#[repr(C)]
struct SockCommonHead {
    daddr: u32,
    rcv_saddr: u32,
    hash: u32,
    dport: u16,
    num: u16,
    family: u16,
    state: u8,
}

/// The socket's addresses. Each field is its own load, which the verifier checks against the
/// running kernel's BTF.
///
/// # Safety
/// `sk` is the kernel's non-null socket pointer of an iterator's context.
#[inline(always)]
unsafe fn sock_addrs(sk: *const core::ffi::c_void) -> lb_common::SockAddrs {
    use core::ptr::{addr_of, read_volatile};
    let head = sk.cast::<SockCommonHead>();
    // SAFETY: the caller's promise; the loads are the kernel's (BPF_PROBE_MEM) socket reads.
    unsafe {
        lb_common::SockAddrs {
            peer_addr: read_volatile(addr_of!((*head).daddr)),
            local_addr: read_volatile(addr_of!((*head).rcv_saddr)),
            peer_port_be: read_volatile(addr_of!((*head).dport)),
            local_port: read_volatile(addr_of!((*head).num)),
            family: read_volatile(addr_of!((*head).family)),
            tcp_state: read_volatile(addr_of!((*head).state)),
            holds: 0,
        }
    }
}

/// Writes one `SocketEntry` to the iterator's `seq_file`.
///
/// # Safety
/// `seq` is the iterator's `seq_file`; `sk` and `value` are the kernel's pointers or null.
#[inline(always)]
unsafe fn write_entry(
    seq: *mut core::ffi::c_void,
    sk: *mut core::ffi::c_void,
    value: *mut SockState,
) {
    use aya_ebpf::helpers::generated::{bpf_get_socket_cookie, bpf_seq_write};
    if sk.is_null() || value.is_null() {
        return;
    }
    // SAFETY: the caller's promise; both pointers were checked non-null.
    unsafe {
        let entry = lb_common::SocketEntry {
            cookie: bpf_get_socket_cookie(sk),
            state: *value,
        };
        bpf_seq_write(
            seq.cast(),
            core::ptr::from_ref(&entry).cast_mut().cast(),
            size_of::<lb_common::SocketEntry>() as u32,
        );
    }
}
