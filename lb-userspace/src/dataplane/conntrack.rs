//! The kernel's connection tracking table, as the outside path needs it: the UDP flows of one
//! family, and their deletion. A UDP flow the outside path translated keeps its endpoint in
//! conntrack for as long as packets keep coming; when that endpoint stops serving, the flow is
//! deleted so the client's next packet is translated anew (kube-proxy's
//! `pkg/proxy/conntrack/cleanup.go`). ctnetlink messages through rust-netlink's crates, one
//! dump per family and one delete per flow.
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple},
};
use netlink_sys::{Socket, SocketAddr as NetlinkAddr, protocols::NETLINK_NETFILTER};

use crate::vocab::Family;

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("the conntrack netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("a conntrack message does not parse: {0}")]
    Decode(String),
    #[error("conntrack refused the request: errno {0}")]
    Refused(i32),
}

/// One UDP flow: where its first packet went, and where replies come from (an endpoint, once
/// translated; the address itself, when nothing translated it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub orig_src: SocketAddr,
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
}

fn proto_family(family: Family) -> NetfilterProtoFamily {
    match family {
        Family::IPv4 => NetfilterProtoFamily::IPv4,
        Family::IPv6 => NetfilterProtoFamily::IPv6,
    }
}

fn socket() -> Result<Socket, ConntrackError> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
    socket.bind_auto().map_err(ConntrackError::Socket)?;
    socket
        .connect(&NetlinkAddr::new(0, 0))
        .map_err(ConntrackError::Socket)?;
    Ok(socket)
}

fn send(
    socket: &Socket,
    flags: u16,
    family: Family,
    message: ConntrackMessage,
) -> Result<(), ConntrackError> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(proto_family(family), 0, 0),
            message,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0).map_err(ConntrackError::Socket)?;
    Ok(())
}

/// Reads replies until the dump's end or the request's acknowledgement, handing each conntrack
/// message to `each`.
fn receive(
    socket: &Socket,
    mut each: impl FnMut(&[ConntrackAttribute]),
) -> Result<(), ConntrackError> {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let size = socket
            .recv(&mut &mut buf[..], 0)
            .map_err(ConntrackError::Socket)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[offset..size])
                .map_err(|e| ConntrackError::Decode(e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(()),
                        Some(code) => Err(ConntrackError::Refused(code.get())),
                    };
                }
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner:
                        NetfilterMessageInner::Conntrack(
                            ConntrackMessage::New(attrs) | ConntrackMessage::Get(attrs),
                        ),
                    ..
                }) => each(&attrs),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// (source, destination, protocol number) of a tuple.
fn endpoints(tuple: &[Tuple]) -> Option<(SocketAddr, SocketAddr, u8)> {
    let (mut src, mut dst, mut sport, mut dport, mut proto) = (None, None, None, None, None);
    for part in tuple {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for p in protos {
                    match p {
                        ProtoTuple::Protocol(p) => proto = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(p) => sport = Some(*p),
                        ProtoTuple::DestinationPort(p) => dport = Some(*p),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        SocketAddr::new(src?, sport?),
        SocketAddr::new(dst?, dport?),
        proto?,
    ))
}

/// Every UDP flow of `family`.
pub fn udp_flows(family: Family) -> Result<Vec<Flow>, ConntrackError> {
    let socket = socket()?;
    send(
        &socket,
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        ConntrackMessage::Get(vec![]),
    )?;
    let mut flows = Vec::new();
    receive(&socket, |attrs| {
        let mut orig = None;
        let mut reply = None;
        for a in attrs {
            match a {
                ConntrackAttribute::CtaTupleOrig(t) => orig = endpoints(t),
                ConntrackAttribute::CtaTupleReply(t) => reply = endpoints(t),
                _ => {}
            }
        }
        if let (Some((src, dst, 17)), Some((reply_src, _, _))) = (orig, reply) {
            flows.push(Flow {
                orig_src: src,
                orig_dst: dst,
                reply_src,
            });
        }
    })?;
    Ok(flows)
}

/// Deletes one flow by its original tuple. `false` when it was already gone.
pub fn delete(flow: &Flow) -> Result<bool, ConntrackError> {
    let family = if flow.orig_dst.is_ipv4() {
        Family::IPv4
    } else {
        Family::IPv6
    };
    let ip = |a: IpAddr| a;
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(ip(flow.orig_src.ip())),
            IPTuple::DestinationAddress(ip(flow.orig_dst.ip())),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(flow.orig_src.port()),
            ProtoTuple::DestinationPort(flow.orig_dst.port()),
        ]),
    ];
    let socket = socket()?;
    send(
        &socket,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]),
    )?;
    match receive(&socket, |_| {}) {
        Ok(()) => Ok(true),
        Err(ConntrackError::Refused(code)) if code == -libc::ENOENT || code == libc::ENOENT => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
