//! The client side of the sandbox: commands the tests send to an `sbx client` process running in
//! the client cgroup and namespace, and what it reports back. Everything is what an application
//! would observe: which backend answered, the errno, what getpeername or recvfrom said.
use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// `count` short connections: connect, read the backend's greeting, getpeername, close.
    /// With `udp`, a connected UDP socket sends one datagram and reads the reply.
    Connect {
        target: SocketAddr,
        count: usize,
        #[serde(default)]
        udp: bool,
    },
    /// One unconnected UDP socket: `count` times sendto(target) then recvfrom. With `id`,
    /// the same socket is kept and reused by later commands with that id.
    SendTo {
        target: SocketAddr,
        count: usize,
        #[serde(default)]
        id: Option<u32>,
    },
    /// A long-lived connection (TCP, or connected UDP) kept under `id`.
    Open {
        id: u32,
        target: SocketAddr,
        #[serde(default)]
        udp: bool,
    },
    /// As `Open` over TCP, with a multipath TCP socket (`IPPROTO_MPTCP`): connect, read the
    /// greeting, getpeername; kept under `id`.
    OpenMptcp {
        id: u32,
        target: SocketAddr,
    },
    /// A UDP socket connected to `target` and kept under `id`, with nothing sent: as a resolver
    /// holds one (the first `Exchange` sends).
    ConnectUdp {
        id: u32,
        target: SocketAddr,
    },
    /// Opens `count` connected UDP sockets to `target` and keeps them open (until `Release`):
    /// a pod holding many sockets. Reports how many connects succeeded and the errors.
    Hold {
        target: SocketAddr,
        count: usize,
    },
    /// Closes every socket `Hold` opened.
    Release,
    /// Sends `msg` on connection `id` and reads the answer; `peer_names` holds what
    /// getpeername reported for the connection.
    Exchange {
        id: u32,
        msg: String,
    },
    Close {
        id: u32,
    },
    /// Connects socket `id` (UDP, or TCP) again: to `target`, or with `None` disconnects it
    /// (`connect()` to `AF_UNSPEC`); it stays open. A TCP socket must be disconnected before
    /// it connects again; its reply's `peer_names` holds what getpeername then reported.
    Reconnect {
        id: u32,
        target: Option<SocketAddr>,
    },
    /// `count` request/response transactions (connect, one line each way, close), timed:
    /// the reply's `latencies_ns` holds each `connect()`'s duration, `elapsed_ns` the total.
    Bench {
        /// Each connect goes to one of these, picked at random (as a load balancer would).
        targets: Vec<SocketAddr>,
        count: usize,
    },
    /// `count` timed operations of one kind (see [`Op`]), each to one of `targets` at random;
    /// the reply's `latencies_ns` holds each operation's duration.
    Ops {
        kind: Op,
        targets: Vec<SocketAddr>,
        count: usize,
    },
    /// One connection that sends `bytes` to a sink backend and waits for its count.
    Bulk {
        target: SocketAddr,
        bytes: u64,
    },
    /// Connects again and again (connect, read the greeting, close), writing one line per
    /// connect to `out`: `start_ns end_ns backend` or `start_ns end_ns !errno` (wall clock),
    /// until at least `min_count` connects were made and `stop` exists, or `max_seconds` pass.
    Record {
        target: SocketAddr,
        out: std::path::PathBuf,
        stop: std::path::PathBuf,
        min_count: usize,
        max_seconds: u64,
    },
}

/// What one timed operation of [`Command::Ops`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// TCP: connect, getpeername, close; times the whole.
    TcpPeerName,
    /// One UDP socket for all operations: sendto, then recvfrom; times the round trip.
    UdpUnconnected,
    /// A new UDP socket per operation: connect, send, recv, close (what a stub resolver does
    /// per query); times the whole.
    UdpConnected,
    /// A new UDP socket connected to the target; times only its `close()`.
    UdpClose,
    /// A TCP connection to the target that sends a line and reads the answer; times only its
    /// `close()`.
    TcpClose,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    pub error: Option<String>,
    /// Backend address, as the backend reported it → answers.
    pub backends: BTreeMap<String, usize>,
    /// errno name → failures.
    pub errors: BTreeMap<String, usize>,
    /// What getpeername (TCP, connected UDP) or recvfrom (unconnected UDP) reported → times.
    pub peer_names: BTreeMap<String, usize>,
    /// The client address the backend saw → times.
    pub seen_as: BTreeMap<String, usize>,
    /// The raw answer line (open, exchange).
    pub line: Option<String>,
    /// Bench: each `connect()`'s duration.
    #[serde(default)]
    pub latencies_ns: Vec<u64>,
    /// Bench, bulk: wall time of the whole command.
    #[serde(default)]
    pub elapsed_ns: u64,
}

impl Reply {
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(message.into()),
            ..Self::default()
        }
    }

    fn count_answer(&mut self, answer: &str) {
        let field = |key: &str| {
            answer
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_string)
        };
        if let Some(b) = field("backend=") {
            *self.backends.entry(b).or_default() += 1;
        }
        if let Some(p) = field("peer=") {
            *self.seen_as.entry(p).or_default() += 1;
        }
    }

    fn count_error(&mut self, e: &std::io::Error) {
        *self.errors.entry(errno_name(e)).or_default() += 1;
    }

    /// Total answers from backends.
    pub fn answers(&self) -> usize {
        self.backends.values().sum()
    }

    pub fn failures(&self) -> usize {
        self.errors.values().sum()
    }
}

/// The errno's symbolic name (ECONNREFUSED, ENETUNREACH, ...), or the error text.
pub fn errno_name(e: &std::io::Error) -> String {
    let names = [
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::ENETUNREACH, "ENETUNREACH"),
        (libc::EHOSTUNREACH, "EHOSTUNREACH"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::EPERM, "EPERM"),
        (libc::ECONNRESET, "ECONNRESET"),
        (libc::ECONNABORTED, "ECONNABORTED"),
        (libc::EPIPE, "EPIPE"),
        (libc::EDESTADDRREQ, "EDESTADDRREQ"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::EINPROGRESS, "EINPROGRESS"),
    ];
    match e.raw_os_error() {
        Some(code) => names
            .iter()
            .find(|(c, _)| *c == code)
            .map_or_else(|| format!("errno {code}"), |(_, n)| (*n).to_string()),
        None if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            "timeout".into()
        }
        None => e.to_string(),
    }
}

const IO_TIMEOUT: Duration = Duration::from_secs(3);

enum Conn {
    Tcp(BufReader<TcpStream>),
    Udp(UdpSocket),
}

/// The client process's open connections.
#[derive(Default)]
pub struct ClientState {
    conns: HashMap<u32, Conn>,
    held: Vec<UdpSocket>,
}

impl ClientState {
    pub fn run(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Connect { target, count, udp } => connect_many(target, count, udp),
            Command::SendTo { target, count, id } => self.send_to(target, count, id),
            Command::Open { id, target, udp } => self.open(id, target, udp),
            Command::OpenMptcp { id, target } => self.open_stream(id, mptcp_connect(target)),
            Command::Exchange { id, msg } => self.exchange(id, &msg),
            Command::ConnectUdp { id, target } => match udp_connected(target) {
                Ok(s) => {
                    let mut reply = Reply {
                        ok: true,
                        ..Reply::default()
                    };
                    if let Ok(peer) = s.peer_addr() {
                        *reply.peer_names.entry(peer.to_string()).or_default() += 1;
                    }
                    self.conns.insert(id, Conn::Udp(s));
                    reply
                }
                Err(e) => {
                    let mut reply = Reply::error(format!("connect: {e}"));
                    reply.count_error(&e);
                    reply
                }
            },
            Command::Hold { target, count } => self.hold(target, count),
            Command::Release => {
                self.held.clear();
                Reply {
                    ok: true,
                    ..Reply::default()
                }
            }
            Command::Bench { targets, count } => bench(&targets, count),
            Command::Ops {
                kind,
                targets,
                count,
            } => ops(kind, &targets, count),
            Command::Bulk { target, bytes } => bulk(target, bytes),
            Command::Record {
                target,
                out,
                stop,
                min_count,
                max_seconds,
            } => record(target, &out, &stop, min_count, max_seconds),
            Command::Close { id } => {
                self.conns.remove(&id);
                Reply {
                    ok: true,
                    ..Reply::default()
                }
            }
            Command::Reconnect { id, target } => match self.conns.get(&id) {
                Some(Conn::Udp(s)) => {
                    match target.map_or_else(|| disconnect(s), |t| s.connect(t)) {
                        Ok(()) => Reply {
                            ok: true,
                            ..Reply::default()
                        },
                        Err(e) => Reply::error(format!("reconnect: {e}")),
                    }
                }
                Some(Conn::Tcp(s)) => reconnect_tcp(s.get_ref(), target),
                None => Reply::error(format!("no connection {id}")),
            },
        }
    }

    fn hold(&mut self, target: SocketAddr, count: usize) -> Reply {
        let mut reply = Reply {
            ok: true,
            ..Reply::default()
        };
        self.held.reserve(count);
        for _ in 0..count {
            match udp_connected(target) {
                Ok(s) => {
                    self.held.push(s);
                    *reply.backends.entry("held".into()).or_default() += 1;
                }
                Err(e) => reply.count_error(&e),
            }
        }
        reply
    }

    fn send_to(&mut self, target: SocketAddr, count: usize, id: Option<u32>) -> Reply {
        let Some(id) = id else {
            return match unconnected_udp(target) {
                Ok(socket) => send_to(&socket, target, count),
                Err(e) => Reply::error(e.to_string()),
            };
        };
        if let std::collections::hash_map::Entry::Vacant(slot) = self.conns.entry(id) {
            match unconnected_udp(target) {
                Ok(s) => {
                    slot.insert(Conn::Udp(s));
                }
                Err(e) => return Reply::error(e.to_string()),
            }
        }
        match self.conns.get(&id) {
            Some(Conn::Udp(s)) => send_to(s, target, count),
            _ => Reply::error(format!("connection {id} is not a UDP socket")),
        }
    }

    fn open(&mut self, id: u32, target: SocketAddr, udp: bool) -> Reply {
        if !udp {
            return self.open_stream(id, tcp_connect(target));
        }
        let result = udp_connected(target).and_then(|s| {
            let answer = udp_roundtrip(&s, "open")?;
            let peer = s.peer_addr()?;
            Ok((Conn::Udp(s), answer, peer))
        });
        self.keep(id, result)
    }

    /// A connected stream kept under `id`, once it read the backend's greeting.
    fn open_stream(&mut self, id: u32, stream: std::io::Result<TcpStream>) -> Reply {
        let result = stream.and_then(|s| {
            let peer = s.peer_addr()?;
            let mut r = BufReader::new(s);
            let answer = read_line(&mut r)?;
            Ok((Conn::Tcp(r), answer, peer))
        });
        self.keep(id, result)
    }

    fn keep(&mut self, id: u32, result: std::io::Result<(Conn, String, SocketAddr)>) -> Reply {
        let mut reply = Reply {
            ok: true,
            ..Reply::default()
        };
        match result {
            Ok((conn, answer, peer)) => {
                reply.count_answer(&answer);
                *reply.peer_names.entry(peer.to_string()).or_default() += 1;
                reply.line = Some(answer);
                self.conns.insert(id, conn);
            }
            Err(e) => {
                reply.ok = false;
                reply.count_error(&e);
            }
        }
        reply
    }

    fn exchange(&mut self, id: u32, msg: &str) -> Reply {
        let mut reply = Reply {
            ok: true,
            ..Reply::default()
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return Reply::error(format!("no connection {id}"));
        };
        // What getpeername reports for the connection, before the exchange.
        let peer = match conn {
            Conn::Tcp(r) => r.get_ref().peer_addr(),
            Conn::Udp(s) => s.peer_addr(),
        };
        if let Ok(peer) = peer {
            *reply.peer_names.entry(peer.to_string()).or_default() += 1;
        }
        let result = match conn {
            Conn::Tcp(r) => writeln!(r.get_mut(), "{msg}").and_then(|()| read_line(r)),
            Conn::Udp(s) => udp_roundtrip(s, msg),
        };
        match result {
            Ok(answer) => {
                reply.count_answer(&answer);
                reply.line = Some(answer);
            }
            Err(e) => {
                reply.ok = false;
                reply.count_error(&e);
            }
        }
        reply
    }
}

fn tcp_connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&target, IO_TIMEOUT)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

fn mptcp_connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(target),
        socket2::Type::STREAM,
        Some(socket2::Protocol::MPTCP),
    )?;
    s.connect_timeout(&target.into(), IO_TIMEOUT)?;
    let s = TcpStream::from(s);
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

fn udp_connected(target: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(local)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.connect(target)?;
    Ok(s)
}

fn udp_roundtrip(s: &UdpSocket, msg: &str) -> std::io::Result<String> {
    s.send(msg.as_bytes())?;
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn read_line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
    }
    Ok(line.trim_end().to_string())
}

fn connect_many(target: SocketAddr, count: usize, udp: bool) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    for _ in 0..count {
        let result = if udp {
            udp_connected(target).and_then(|s| {
                let answer = udp_roundtrip(&s, "hello")?;
                Ok((answer, s.peer_addr()?))
            })
        } else {
            tcp_connect(target).and_then(|s| {
                let peer = s.peer_addr()?;
                Ok((read_line(&mut BufReader::new(s))?, peer))
            })
        };
        match result {
            Ok((answer, peer)) => {
                reply.count_answer(&answer);
                *reply.peer_names.entry(peer.to_string()).or_default() += 1;
            }
            Err(e) => reply.count_error(&e),
        }
    }
    reply
}

fn unconnected_udp(target: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let socket = UdpSocket::bind(local)?;
    socket.set_read_timeout(Some(IO_TIMEOUT))?;
    Ok(socket)
}

/// A TCP socket disconnected (`target` `None`) or connected again, blocking, to `target`, with
/// what getpeername then reports.
fn reconnect_tcp(stream: &TcpStream, target: Option<SocketAddr>) -> Reply {
    let result = match target {
        None => disconnect(stream),
        Some(t) => socket2::SockRef::from(stream).connect(&t.into()),
    };
    let mut reply = match result {
        Ok(()) => Reply {
            ok: true,
            ..Reply::default()
        },
        Err(e) => return Reply::error(format!("reconnect: {e}")),
    };
    if let Ok(peer) = stream.peer_addr() {
        reply.peer_names.insert(peer.to_string(), 1);
    }
    reply
}

/// `connect()` to an `AF_UNSPEC` address: the socket forgets its peer.
fn disconnect(socket: &impl std::os::fd::AsRawFd) -> std::io::Result<()> {
    // SAFETY: an all-zero sockaddr is valid; only its family is set.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: the socket's own descriptor and a valid address of the given size.
    let rc = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            &raw const addr,
            size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn send_to(socket: &UdpSocket, target: SocketAddr, count: usize) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    let mut buf = [0u8; 2048];
    for i in 0..count {
        let result = socket
            .send_to(format!("datagram {i}").as_bytes(), target)
            .and_then(|_| socket.recv_from(&mut buf));
        match result {
            Ok((n, from)) => {
                reply.count_answer(&String::from_utf8_lossy(&buf[..n]));
                *reply.peer_names.entry(from.to_string()).or_default() += 1;
            }
            Err(e) => reply.count_error(&e),
        }
    }
    reply
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn bench(targets: &[SocketAddr], count: usize) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    if targets.is_empty() {
        return Reply::error("bench: no targets");
    }
    reply.latencies_ns.reserve(count);
    let start = std::time::Instant::now();
    let mut random = u64::from(start.elapsed().subsec_nanos()) | 1;
    for _ in 0..count {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let target = targets[usize::try_from(random % targets.len() as u64).unwrap_or(0)];
        let t0 = std::time::Instant::now();
        let result = TcpStream::connect_timeout(&target, IO_TIMEOUT).and_then(|mut s| {
            let connected = t0.elapsed();
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.write_all(b"ping\n")?;
            let mut r = BufReader::new(s);
            let greeting = read_line(&mut r)?;
            Ok((connected, greeting))
        });
        match result {
            Ok((connected, greeting)) => {
                reply.latencies_ns.push(nanos(connected));
                reply.count_answer(&greeting);
            }
            Err(e) => reply.count_error(&e),
        }
    }
    reply.elapsed_ns = nanos(start.elapsed());
    reply
}

/// A xorshift stream for picking targets (no quality needed, only spread).
struct Pick(u64);

impl Pick {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::from(d.subsec_nanos()));
        Self(seed | 1)
    }

    fn of<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        &items[usize::try_from(self.0 % items.len() as u64).unwrap_or(0)]
    }
}

fn ops(op: Op, targets: &[SocketAddr], count: usize) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    let Some(first) = targets.first() else {
        return Reply::error("ops: no targets");
    };
    let shared = match op {
        Op::UdpUnconnected => match unconnected_udp(*first) {
            Ok(s) => Some(s),
            Err(e) => return Reply::error(format!("socket: {e}")),
        },
        _ => None,
    };
    let mut pick = Pick::new();
    let mut buf = [0u8; 2048];
    reply.latencies_ns.reserve(count);
    let start = std::time::Instant::now();
    for i in 0..count {
        let target = *pick.of(targets);
        let t0 = std::time::Instant::now();
        let result: std::io::Result<Option<String>> = match op {
            Op::TcpPeerName => TcpStream::connect_timeout(&target, IO_TIMEOUT)
                .and_then(|s| s.peer_addr())
                .map(|peer| Some(format!("peer={peer}"))),
            Op::UdpUnconnected => shared.as_ref().map_or(Ok(None), |s| {
                s.send_to(format!("datagram {i}").as_bytes(), target)?;
                let (n, _) = s.recv_from(&mut buf)?;
                Ok(Some(String::from_utf8_lossy(&buf[..n]).into_owned()))
            }),
            Op::UdpConnected => {
                udp_connected(target).and_then(|s| udp_roundtrip(&s, "query").map(Some))
            }
            Op::UdpClose => udp_connected(target).map(|s| {
                let t1 = std::time::Instant::now();
                drop(s);
                reply.latencies_ns.push(nanos(t1.elapsed()));
                None
            }),
            Op::TcpClose => TcpStream::connect_timeout(&target, IO_TIMEOUT).and_then(|mut s| {
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.write_all(b"ping\n")?;
                let mut r = BufReader::new(s);
                let answer = read_line(&mut r)?;
                let t1 = std::time::Instant::now();
                drop(r);
                reply.latencies_ns.push(nanos(t1.elapsed()));
                Ok(Some(answer))
            }),
        };
        match result {
            Ok(answer) => {
                if !matches!(op, Op::UdpClose | Op::TcpClose) {
                    reply.latencies_ns.push(nanos(t0.elapsed()));
                }
                if let Some(a) = answer {
                    reply.count_answer(&a);
                }
            }
            Err(e) => reply.count_error(&e),
        }
    }
    reply.elapsed_ns = nanos(start.elapsed());
    reply
}

fn bulk(target: SocketAddr, bytes: u64) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    let start = std::time::Instant::now();
    let result = TcpStream::connect_timeout(&target, IO_TIMEOUT).and_then(|mut s| {
        s.set_read_timeout(Some(std::time::Duration::from_mins(1)))?;
        let chunk = vec![0x5a_u8; 256 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
            s.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        read_line(&mut BufReader::new(s))
    });
    match result {
        Ok(line) => {
            reply.count_answer(&line);
            reply.line = Some(line);
        }
        Err(e) => {
            reply.ok = false;
            reply.count_error(&e);
        }
    }
    reply.elapsed_ns = nanos(start.elapsed());
    reply
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, nanos)
}

fn record(
    target: SocketAddr,
    out: &std::path::Path,
    stop: &std::path::Path,
    min_count: usize,
    max_seconds: u64,
) -> Reply {
    let mut reply = Reply {
        ok: true,
        ..Reply::default()
    };
    let file = match std::fs::File::create(out) {
        Ok(f) => f,
        Err(e) => return Reply::error(format!("{}: {e}", out.display())),
    };
    // A line at a time, so that a test can count the connects made so far
    // (`Load::answered_since`).
    let mut w = std::io::LineWriter::new(file);
    let start = std::time::Instant::now();
    let mut n = 0usize;
    while (n < min_count || !stop.exists()) && start.elapsed().as_secs() < max_seconds {
        n += 1;
        let t0 = wall_ns();
        let result = tcp_connect(target).and_then(|s| read_line(&mut BufReader::new(s)));
        let t1 = wall_ns();
        let line = match result {
            Ok(answer) => {
                reply.count_answer(&answer);
                let backend = answer
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("backend="))
                    .unwrap_or("?")
                    .to_string();
                format!("{t0} {t1} {backend}")
            }
            Err(e) => {
                reply.count_error(&e);
                format!("{t0} {t1} !{}", errno_name(&e))
            }
        };
        if writeln!(w, "{line}").is_err() {
            return Reply::error("writing the record");
        }
    }
    let _ = w.flush();
    reply.elapsed_ns = nanos(start.elapsed());
    reply
}
