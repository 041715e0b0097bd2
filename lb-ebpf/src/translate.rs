//! The translation logic behind every hook. Each `try_*` returns the hook's verdict or a `Fault`
//! that the entry point counts and turns into a verdict.
use aya_ebpf::{
    helpers::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
        generated::bpf_set_retval,
    },
    programs::{SockAddrContext, SockContext},
};
use aya_log_ebpf::debug;
use lb_common::{
    AffinityKey, AffinityValue, Backend, FRONTEND_FLAG_AFFINITY, Frontend, FrontendKey,
    PROTOCOL_TCP, PROTOCOL_UDP, SlotKey, SockState, counter,
};

use crate::{
    maps::{AFFINITY, BACKENDS, FRONTENDS, SLOTS, SOCK_STATE, count},
    sockaddr::{self, SockAddr},
};

/// Hook return values.
pub const ALLOW: i32 = 1;
pub const REJECT: i32 = 0;

const ECONNREFUSED: i32 = 111;
const EHOSTUNREACH: i32 = 113;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Something the maps should never hold: a frontend whose slot or backend is missing.
pub enum Fault {
    SlotMissing,
    BackendMissing,
}

/// Which hook translates: `connect()` picks a backend afresh (or by affinity); `sendmsg()` on an
/// unconnected UDP socket keeps the socket's previous backend while it is still in the service.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Connect,
    SendMsg,
}

/// Which address family the socket itself has (an AF_INET6 socket may dial IPv4-mapped addresses).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SocketFamily {
    V4,
    V6,
}

struct Choice {
    slot: u32,
    backend_id: u32,
    /// The socket's record already says so (a UDP socket reusing its backend).
    recorded: bool,
}

/// connect4/6 and sendmsg4/6: a service address becomes one of its backends.
#[inline(always)]
pub fn try_translate(
    ctx: &SockAddrContext,
    hook: Hook,
    family: SocketFamily,
) -> Result<i32, Fault> {
    let dest = load(ctx, family);
    let protocol = sockaddr::protocol(ctx);
    if protocol != PROTOCOL_TCP && protocol != PROTOCOL_UDP {
        return Ok(ALLOW);
    }
    let key = FrontendKey {
        addr: dest.addr,
        port_be: dest.port_be,
        protocol,
        family: dest.family,
    };
    // SAFETY: the value is copied out at once; the agent replaces frontends whole.
    let Some(frontend) = (unsafe { FRONTENDS.get(key) }).copied() else {
        return Ok(ALLOW);
    };

    if frontend.count == 0 {
        count(counter::NO_BACKEND);
        debug!(
            ctx,
            "service {} has no backend: refused", frontend.service_id
        );
        return Ok(refuse(ECONNREFUSED));
    }
    let choice = choose(ctx, hook, family, &key, &frontend)?;
    // SAFETY: copied at once, as above.
    let backend = (unsafe { BACKENDS.get(choice.backend_id) })
        .copied()
        .ok_or(Fault::BackendMissing)?;
    store(ctx, family, &backend.addr, backend.port_be, backend.family);
    if !choice.recorded {
        remember(ctx, &key, &backend, frontend.service_id, &choice);
    }
    count(counter::TRANSLATIONS);
    debug!(
        ctx,
        "service {} slot {} -> backend {}", frontend.service_id, choice.slot, choice.backend_id
    );
    Ok(ALLOW)
}

/// getpeername4/6 and recvmsg4/6: a socket that was translated reports the service address as
/// its peer, as it would behind a NAT-based proxy.
#[inline(always)]
pub fn try_reverse(ctx: &SockAddrContext, family: SocketFamily) -> i32 {
    // SAFETY: copied at once; the entry may be deleted concurrently only when the socket is
    // released, which cannot happen while it runs this hook.
    let Some(state) = (unsafe { SOCK_STATE.get(socket_cookie(ctx)) }).copied() else {
        return ALLOW;
    };
    let peer = load(ctx, family);
    let backend = &state.backend;
    if backend.family == peer.family && backend.port_be == peer.port_be && backend.addr == peer.addr
    {
        let frontend = &state.frontend;
        store(
            ctx,
            family,
            &frontend.addr,
            frontend.port_be,
            frontend.family,
        );
        count(counter::REVERSE_TRANSLATIONS);
    }
    ALLOW
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
pub fn fault_verdict(ctx: &SockAddrContext, fault: &Fault) -> i32 {
    count(counter::ERRORS);
    match fault {
        Fault::SlotMissing => debug!(ctx, "frontend points at a missing slot"),
        Fault::BackendMissing => debug!(ctx, "slot points at a missing backend"),
    }
    refuse(EHOSTUNREACH)
}

#[inline(always)]
fn choose(
    ctx: &SockAddrContext,
    hook: Hook,
    family: SocketFamily,
    key: &FrontendKey,
    frontend: &Frontend,
) -> Result<Choice, Fault> {
    if frontend.flags & FRONTEND_FLAG_AFFINITY != 0 {
        return choose_with_affinity(ctx, family, key, frontend);
    }
    if hook == Hook::SendMsg {
        // SAFETY: this socket's own entry, copied at once.
        if let Some(state) = (unsafe { SOCK_STATE.get(socket_cookie(ctx)) }).copied()
            && state.frontend == *key
            && slot_holds(frontend, state.slot, state.backend_id)
        {
            count(counter::STICKY_HITS);
            return Ok(Choice {
                slot: state.slot,
                backend_id: state.backend_id,
                recorded: true,
            });
        }
    }
    choose_random(frontend)
}

#[inline(always)]
fn choose_random(frontend: &Frontend) -> Result<Choice, Fault> {
    // SAFETY: plain helper call.
    let random = unsafe { bpf_get_prandom_u32() };
    let slot = random % u32::from(frontend.count) + 1;
    let key = SlotKey {
        service_id: frontend.service_id,
        slot,
    };
    // SAFETY: copied at once.
    let backend_id = (unsafe { SLOTS.get(key) })
        .copied()
        .ok_or(Fault::SlotMissing)?;
    Ok(Choice {
        slot,
        backend_id,
        recorded: false,
    })
}

/// True while `slot` is active in the frontend and still holds `backend_id`.
#[inline(always)]
fn slot_holds(frontend: &Frontend, slot: u32, backend_id: u32) -> bool {
    if slot == 0 || slot > u32::from(frontend.count) {
        return false;
    }
    let key = SlotKey {
        service_id: frontend.service_id,
        slot,
    };
    // SAFETY: read once.
    matches!(unsafe { SLOTS.get(key) }, Some(id) if *id == backend_id)
}

#[inline(always)]
fn choose_with_affinity(
    ctx: &SockAddrContext,
    family: SocketFamily,
    key: &FrontendKey,
    frontend: &Frontend,
) -> Result<Choice, Fault> {
    let client = AffinityKey {
        // SAFETY: helper available to sock_addr programs (5.7+).
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.sock_addr.cast()) },
        client: sockaddr::bound_source(ctx, family == SocketFamily::V6),
        service_id: frontend.service_id,
        family: key.family,
        _pad: [0; 3],
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let timeout = u64::from(frontend.affinity_timeout_s) * NANOS_PER_SECOND;
    if let Some(entry) = AFFINITY.get_ptr_mut(client) {
        // SAFETY: the LRU entry may be evicted concurrently, but the memory stays valid for the
        // program run (RCU); a torn read only costs a fresh choice.
        let entry = unsafe { &mut *entry };
        if now.saturating_sub(entry.last_used_ns) <= timeout
            && slot_holds(frontend, entry.slot, entry.backend_id)
        {
            entry.last_used_ns = now;
            count(counter::AFFINITY_HITS);
            return Ok(Choice {
                slot: entry.slot,
                backend_id: entry.backend_id,
                recorded: false,
            });
        }
    }
    let choice = choose_random(frontend)?;
    let value = AffinityValue {
        last_used_ns: now,
        backend_id: choice.backend_id,
        slot: choice.slot,
    };
    // A full LRU evicts the oldest client; an insert failure only loses stickiness.
    let _ = AFFINITY.insert(client, value, 0);
    Ok(choice)
}

/// The socket's cookie: unique for the boot, the key of its `SOCK_STATE` entry.
#[inline(always)]
fn socket_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: helper available to sock_addr programs.
    unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) }
}

/// Records the translation for getpeername, recvmsg and UDP stickiness. When `SOCK_STATE` is
/// full the connection still works; only its reverse translation is lost, and counted.
#[inline(always)]
fn remember(
    ctx: &SockAddrContext,
    key: &FrontendKey,
    backend: &Backend,
    service_id: u32,
    choice: &Choice,
) {
    let state = SockState {
        frontend: *key,
        backend: *backend,
        service_id,
        backend_id: choice.backend_id,
        slot: choice.slot,
        _pad: 0,
    };
    if SOCK_STATE.insert(socket_cookie(ctx), state, 0).is_err() {
        count(counter::SOCK_STATE_FULL);
    }
}

/// `sock_release`: the socket is going away; so does its translation record.
#[inline(always)]
pub fn try_release(ctx: &SockContext) {
    // SAFETY: helper available to cgroup sock programs (5.9+).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock.cast()) };
    let _ = SOCK_STATE.remove(cookie);
}
