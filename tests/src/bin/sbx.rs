//! `sbx`: the sandbox's helper process.
//!
//! `sbx [--cgroup DIR] [--netns NAME] serve ...|client`
//!
//! With `--cgroup` it first moves itself into that cgroup, with `--netns` it then enters that
//! network namespace (in this order: entering the namespace first would hide the cgroup tree).
//! Sockets it creates afterwards belong to both, exactly like a pod's.
//!
//! - `serve --addr IP:PORT [--udp]`: a backend that answers every TCP connection (and every
//!   line on it) or datagram with its own address and the peer address it sees.
//! - `client`: reads JSON commands on stdin, one per line, runs them, and answers with one JSON
//!   line each (see `socklb_tests::client::Command`).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
};

use anyhow::{Context as _, bail};
use socket2::{Domain, Socket, Type};
use socklb_tests::client::{self, Command};

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(dir) = take_opt(&mut args, "--cgroup") {
        std::fs::write(
            format!("{dir}/cgroup.procs"),
            std::process::id().to_string(),
        )
        .with_context(|| format!("joining cgroup {dir}"))?;
    }
    if let Some(ns) = take_opt(&mut args, "--netns") {
        enter_netns(&ns)?;
    }
    match args.first().map(String::as_str) {
        Some("serve") => {
            let addr: SocketAddr = take_opt(&mut args, "--addr")
                .context("serve needs --addr")?
                .parse()?;
            if args.iter().any(|a| a == "--udp") {
                serve_udp(addr)
            } else if args.iter().any(|a| a == "--sink") {
                serve_sink(addr)
            } else {
                serve_tcp(addr)
            }
        }
        Some("client") => run_client(),
        Some("dns") => {
            let addr: SocketAddr = take_opt(&mut args, "--addr")
                .context("dns needs --addr")?
                .parse()?;
            let answer: std::net::Ipv4Addr = take_opt(&mut args, "--answer")
                .context("dns needs --answer")?
                .parse()?;
            serve_dns(addr, answer)
        }
        Some("exec") => {
            use std::os::unix::process::CommandExt as _;
            let program = args.get(1).context("exec needs a program")?;
            let e = std::process::Command::new(program).args(&args[2..]).exec();
            bail!("exec {program}: {e}")
        }
        other => bail!(
            "usage: sbx [--cgroup DIR] [--netns NAME] serve --addr IP:PORT [--udp] | client | \
             dns --addr IP:PORT --answer IPV4 | exec PROGRAM ARGS... (got {other:?})"
        ),
    }
}

fn take_opt(args: &mut Vec<String>, name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    let value = args.get(i + 1).cloned();
    args.drain(i..(i + 2).min(args.len()));
    value
}

fn enter_netns(name: &str) -> anyhow::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{name}"))
        .with_context(|| format!("opening netns {name}"))?;
    // SAFETY: setns on a valid namespace fd; this process is single-threaded here.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn listen(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    // A large backlog: the default 128 overflows under connect loops (1 s SYN retransmits).
    socket.listen(4096)?;
    Ok(socket.into())
}

fn serve_tcp(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = listen(addr)?;
    println!("ready");
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || {
            let _ = answer_tcp(addr, stream);
        });
    }
    Ok(())
}

fn answer_tcp(addr: SocketAddr, mut stream: TcpStream) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    // One write per line, so a reader never sees half a greeting.
    stream.write_all(format!("backend={addr} peer={peer}\n").as_bytes())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    while reader.read_line(&mut line)? > 0 {
        stream.write_all(format!("backend={addr} echo={}\n", line.trim_end()).as_bytes())?;
        line.clear();
    }
    Ok(())
}

/// Bulk sink: reads until the client closes its side, then answers with the byte count.
fn serve_sink(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = listen(addr)?;
    println!("ready");
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || -> std::io::Result<()> {
            let n = std::io::copy(&mut stream.try_clone()?, &mut std::io::sink())?;
            stream.write_all(format!("backend={addr} received={n}\n").as_bytes())
        });
    }
    Ok(())
}

fn serve_udp(addr: SocketAddr) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(addr)?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut buf = [0u8; 2048];
    loop {
        let (n, peer) = socket.recv_from(&mut buf)?;
        let msg = String::from_utf8_lossy(&buf[..n]);
        let reply = format!("backend={addr} peer={peer} echo={}", msg.trim_end());
        let _ = socket.send_to(reply.as_bytes(), peer);
    }
}

/// A DNS server that answers every A question with `answer` (TTL 0) and every other question
/// with no record, so a test can tell which server a resolver reached.
fn serve_dns(addr: SocketAddr, answer: std::net::Ipv4Addr) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(addr)?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut buf = [0u8; 512];
    loop {
        let (n, peer) = socket.recv_from(&mut buf)?;
        if let Some(reply) = dns_reply(&buf[..n], answer) {
            let _ = socket.send_to(&reply, peer);
        }
    }
}

/// The reply to one query: its header and question, with one A record when asked for A/IN.
fn dns_reply(query: &[u8], answer: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    if query.len() < 12 || query[4..6] != [0, 1] {
        return None;
    }
    // The question: the name's labels, a zero byte, then type and class.
    let mut end = 12;
    while *query.get(end)? != 0 {
        end += 1 + usize::from(query[end]);
    }
    let question = query.get(12..end + 5)?;
    let (qtype, qclass) = (
        &question[question.len() - 4..][..2],
        &question[question.len() - 2..],
    );
    let a = qtype == [0, 1] && qclass == [0, 1];
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&query[..2]);
    // QR, opcode 0, AA, RD as asked; RA; NOERROR.
    reply.extend_from_slice(&[0x84 | (query[2] & 0x01), 0x80]);
    reply.extend_from_slice(&[0, 1, 0, u8::from(a), 0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if a {
        reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        reply.extend_from_slice(&answer.octets());
    }
    Some(reply)
}

fn run_client() -> anyhow::Result<()> {
    // A pod may hold many sockets: take the whole hard limit (a test spreads more sockets than
    // one process may hold over several clients).
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls with a valid struct; failing only leaves the default limit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
    let mut state = client::ClientState::default();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    writeln!(out, "{{\"ready\":true}}")?;
    out.flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(cmd) => state.run(cmd),
            Err(e) => client::Reply::error(format!("bad command: {e}")),
        };
        writeln!(out, "{}", serde_json::to_string(&reply)?)?;
        out.flush()?;
    }
    Ok(())
}
