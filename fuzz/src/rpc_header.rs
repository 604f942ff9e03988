//! Target `rpc_header`: the RPC packet header, and packets into RPC endpoints.
//!
//! Invariants, for any input bytes:
//! - `Header::decode` does not panic and agrees exactly (value or error) with an
//!   independent reference decoder written from the format table in `src/rpc/header.rs`;
//!   an accepted input's first 24 bytes re-encode to themselves; errors display;
//! - an arbitrary *valid* header built from the input round-trips through
//!   `encode`/`decode` and passes `validate` under limits it was built for;
//! - the input, split into datagrams at each `E5 01` (magic, version), fed to a server
//!   endpoint and to a client endpoint with a session connecting (which, once connected,
//!   sends a 300-byte request of type 1): nothing panics, each
//!   datagram is counted once, exactly the ones `decode`/`validate` reject are counted
//!   malformed, and every datagram either endpoint sends fits its MTU and is a valid
//!   header (an endpoint never emits what a peer would drop as malformed).

use arbitrary::{Arbitrary, Unstructured};
use zverbs::rpc::{Config, Event, Header, HeaderError, Limits, PktType, RpcCore, HEADER_LEN};

/// Decodes by the table, field by field, in the documented order of checks.
pub fn reference_decode(b: &[u8]) -> Result<Header, HeaderError> {
    if b.len() < 24 {
        return Err(HeaderError::Truncated { len: b.len() });
    }
    if b[0] != 0xE5 {
        return Err(HeaderError::Magic(b[0]));
    }
    if b[1] != 1 {
        return Err(HeaderError::Version(b[1]));
    }
    let le16 = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let t = b[2];
    let pkt_type = match t {
        1 => PktType::ConnectReq,
        2 => PktType::ConnectResp,
        3 => PktType::DisconnectReq,
        4 => PktType::DisconnectResp,
        5 => PktType::Req,
        6 => PktType::Resp,
        7 => PktType::CreditReturn,
        8 => PktType::Rfr,
        _ => return Err(HeaderError::PktType(t)),
    };
    let h = Header {
        pkt_type,
        req_type: b[3],
        dest_session: le16(4),
        src_session: le16(6),
        msg_size: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        pkt_num: le16(12),
        payload_len: le16(14),
        req_num: u64::from_le_bytes(b[16..24].try_into().unwrap()),
    };
    if usize::from(h.payload_len) != b.len() - 24 {
        return Err(HeaderError::PayloadLength {
            claimed: h.payload_len,
            actual: b.len() - 24,
        });
    }
    let data = matches!(t, 5 | 6);
    // Which fields each type uses, from the table: (req_type, dest, msg_size, pkt_num).
    let (uses_type, uses_dest, uses_size, uses_pkt) = match t {
        1 => (false, false, true, false),
        2 => (true, true, false, false),
        3 | 4 => (false, true, false, false),
        5 | 6 => (true, true, true, true),
        _ => (false, true, false, true), // CR, RFR
    };
    let reserved = |field| Err(HeaderError::Reserved { field });
    if !data && h.payload_len != 0 {
        return reserved("payload_len");
    }
    if !uses_type && h.req_type != 0 {
        return reserved("req_type");
    }
    if !uses_dest && h.dest_session != 0 {
        return reserved("dest_session");
    }
    if !uses_size && h.msg_size != 0 {
        return reserved("msg_size");
    }
    if !uses_pkt && h.pkt_num != 0 {
        return reserved("pkt_num");
    }
    if t == 2 && h.req_type > 3 {
        return Err(HeaderError::Status(h.req_type));
    }
    if data && u32::from(h.payload_len) > h.msg_size {
        return Err(HeaderError::PayloadOverMessage {
            payload_len: h.payload_len,
            msg_size: h.msg_size,
        });
    }
    if t == 8 && h.pkt_num == 0 {
        return Err(HeaderError::PktNum(0));
    }
    Ok(h)
}

/// A valid header built from fuzz input, for `LIMITS`.
#[derive(Debug, Arbitrary)]
struct ValidHeader {
    pkt_type: u8,
    req_type: u8,
    dest_session: u16,
    src_session: u16,
    msg_size: u16,
    pkt_num: u16,
    req_num: u64,
}

const CLIENT: u64 = 1;
const SERVER: u64 = 2;

fn config() -> Config {
    Config {
        max_sessions: 2,
        mtu: 128, // 104 message bytes a packet
        max_msg_size: 512,
        ..Config::default()
    }
}

impl ValidHeader {
    fn header(&self, l: &Limits) -> Header {
        let t = PktType::from_byte(self.pkt_type % 8 + 1).unwrap();
        let size = usize::from(self.msg_size) % (l.max_msg_size + 1);
        let pkts = l.num_pkts(size);
        let max_pkts = l.num_pkts(l.max_msg_size);
        let pkt = usize::from(self.pkt_num);
        let mut h = Header {
            pkt_type: t,
            req_type: 0,
            dest_session: (usize::from(self.dest_session) % l.max_sessions) as u16,
            src_session: self.src_session,
            msg_size: 0,
            pkt_num: 0,
            payload_len: 0,
            req_num: self.req_num,
        };
        match t {
            PktType::Req | PktType::Resp => {
                h.req_type = self.req_type;
                h.msg_size = size as u32;
                h.pkt_num = (pkt % pkts) as u16;
                h.payload_len = l.pkt_len(size, pkt % pkts) as u16;
            }
            PktType::ConnectReq => {
                h.dest_session = 0;
                h.msg_size = u32::from(self.msg_size);
            }
            PktType::ConnectResp => h.req_type = self.req_type % 4,
            PktType::CreditReturn => h.pkt_num = (pkt % max_pkts) as u16,
            PktType::Rfr => h.pkt_num = (1 + pkt % (max_pkts - 1).max(1)) as u16,
            _ => {}
        }
        h
    }
}

/// Drains an endpoint: every transmit must be a valid header under `limits`; a connected
/// session gets a 300-byte request of type 1, requests are answered with their bytes
/// reversed, responses read and released.
fn drain(e: &mut RpcCore, now: u64, limits: &Limits, to: u64) {
    let mut buf = [0u8; 128];
    while let Some(t) = e.poll_transmit(now, &mut buf) {
        assert_eq!(t.to, to);
        assert!(t.len <= 128 && t.len >= HEADER_LEN);
        let h = Header::decode(&buf[..t.len]).expect("an endpoint sent a malformed header");
        h.validate(limits)
            .expect("an endpoint sent an invalid header");
    }
    while let Some(ev) = e.poll_event() {
        match ev {
            Event::Request { handle, .. } => {
                let mut r = e.request(handle).expect("a delivered request").to_vec();
                r.reverse();
                e.respond(handle, &r).expect("an answer");
            }
            Event::Connected(s) => {
                e.enqueue_request(s, 1, &[0x33; 300])
                    .expect("a first request");
            }
            Event::Response { handle, .. } => {
                let _ = e.response(handle).expect("a delivered response");
                e.release(handle).expect("a release");
            }
            _ => {}
        }
    }
}

/// Runs every invariant on `data`. Panics on a violation.
pub fn check(data: &[u8]) {
    let got = Header::decode(data);
    assert_eq!(
        got,
        reference_decode(data),
        "decode disagrees with the table on {data:02x?}"
    );
    match got {
        Ok(h) => {
            let mut out = [0u8; HEADER_LEN];
            assert_eq!(h.encode(&mut out), Ok(HEADER_LEN));
            assert_eq!(&out[..], &data[..HEADER_LEN], "re-encoding differs");
            let _ = format!("{h:?}");
        }
        Err(e) => {
            let _ = format!("{e} {e:?}");
        }
    }

    let limits = config().limits();
    // What the endpoints send is checked as a peer with any session table would.
    let peer = Limits {
        max_sessions: 1 << 16,
        ..limits
    };
    if let Ok(v) = ValidHeader::arbitrary(&mut Unstructured::new(data)) {
        let h = v.header(&limits);
        let mut bytes = vec![0x5a; HEADER_LEN + usize::from(h.payload_len)];
        assert_eq!(h.encode(&mut bytes), Ok(HEADER_LEN));
        assert_eq!(Header::decode(&bytes), Ok(h), "round trip of {h:?}");
        assert_eq!(h.validate(&limits), Ok(()), "{h:?}");
    }

    // The datagrams, each starting at a magic and version (the first at 0).
    let mut starts: Vec<usize> = (1..data.len().saturating_sub(1))
        .filter(|&i| data[i] == 0xE5 && data[i + 1] == 1)
        .collect();
    starts.insert(0, 0);
    starts.push(data.len());
    let mut server = RpcCore::new(config()).unwrap();
    let mut client = RpcCore::new(config()).unwrap();
    client.connect(SERVER).unwrap();
    let mut malformed = 0;
    let mut now = 0;
    for w in starts.windows(2) {
        let d = &data[w[0]..w[1]];
        malformed += u64::from(Header::decode(d).and_then(|h| h.validate(&limits)).is_err());
        now += 1_000_000;
        drain(&mut client, now, &peer, SERVER);
        server.handle_packet(now, CLIENT, d);
        client.handle_packet(now, SERVER, d);
        server.handle_timeout(now);
        client.handle_timeout(now);
        drain(&mut server, now, &peer, CLIENT);
        drain(&mut client, now, &peer, SERVER);
    }
    let n = starts.len() as u64 - 1;
    for e in [&server, &client] {
        assert_eq!(e.stats().rx_packets, n);
        assert_eq!(e.stats().malformed, malformed);
    }
}
