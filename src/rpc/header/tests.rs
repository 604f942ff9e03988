//! Header round trips and every rejection path.

use super::*;
use HeaderError as E;

const LIMITS: Limits = Limits {
    max_msg_size: 4096,
    data_per_pkt: 1000,
    max_sessions: 4,
};

fn req(msg_size: u32, pkt_num: u16, payload_len: u16) -> Header {
    Header {
        pkt_type: PktType::Req,
        req_type: 7,
        dest_session: 3,
        src_session: 0xBEEF,
        msg_size,
        pkt_num,
        payload_len,
        req_num: 0x0102_0304_0506_0708,
    }
}

/// The header and `payload_len` payload bytes.
fn wire(h: &Header) -> Vec<u8> {
    let mut v = vec![0xAA; HEADER_LEN + usize::from(h.payload_len)];
    assert_eq!(h.encode(&mut v), Ok(HEADER_LEN));
    v
}

#[test]
fn round_trip_and_layout() {
    let h = req(2500, 2, 500);
    let v = wire(&h);
    assert_eq!(Header::decode(&v), Ok(h));
    assert_eq!(h.validate(&LIMITS), Ok(()));
    assert_eq!(
        &v[..HEADER_LEN],
        &[
            0xE5, 1, 5, 7, 3, 0, 0xEF, 0xBE, 0xC4, 0x09, 0, 0, 2, 0, 0xF4, 0x01, 8, 7, 6, 5, 4, 3,
            2, 1
        ]
    );
    for t in 1..=8 {
        let pkt_type = PktType::from_byte(t).unwrap();
        assert_eq!(pkt_type as u8, t);
        let h = Header {
            pkt_type,
            req_type: 0,
            dest_session: u16::from(pkt_type != PktType::ConnectReq),
            src_session: 2,
            msg_size: u32::from(pkt_type.is_data() || pkt_type == PktType::ConnectReq),
            pkt_num: u16::from(matches!(pkt_type, PktType::Rfr)),
            payload_len: u16::from(pkt_type.is_data()),
            req_num: u64::MAX,
        };
        assert_eq!(Header::decode(&wire(&h)), Ok(h), "{pkt_type:?}");
        assert_eq!(h.validate(&LIMITS), Ok(()), "{pkt_type:?}");
    }
    assert_eq!(PktType::from_byte(0), None);
    assert_eq!(PktType::from_byte(9), None);
}

#[test]
fn encode_refuses_a_short_buffer() {
    let mut short = [0u8; HEADER_LEN - 1];
    assert_eq!(
        req(0, 0, 0).encode(&mut short),
        Err(E::Truncated { len: 23 })
    );
    assert_eq!(short, [0; HEADER_LEN - 1]);
}

#[test]
fn decode_rejects() {
    let good = wire(&req(2500, 2, 500));
    let d = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        Header::decode(&v)
    };
    assert_eq!(Header::decode(&[]), Err(E::Truncated { len: 0 }));
    assert_eq!(Header::decode(&good[..23]), Err(E::Truncated { len: 23 }));
    assert_eq!(d(&|v| v[0] = 0xE4), Err(E::Magic(0xE4)));
    assert_eq!(d(&|v| v[1] = 2), Err(E::Version(2)));
    assert_eq!(d(&|v| v[2] = 0), Err(E::PktType(0)));
    assert_eq!(d(&|v| v[2] = 9), Err(E::PktType(9)));
    let long = E::PayloadLength {
        claimed: 500,
        actual: 501,
    };
    assert_eq!(d(&|v| v.push(0)), Err(long));
    assert_eq!(
        d(&|v| v.truncate(HEADER_LEN)),
        Err(E::PayloadLength {
            claimed: 500,
            actual: 0
        })
    );
    // 500 bytes of a 400-byte message.
    assert_eq!(
        d(&|v| v[8..12].copy_from_slice(&400u32.to_le_bytes())),
        Err(E::PayloadOverMessage {
            payload_len: 500,
            msg_size: 400
        })
    );
}

#[test]
fn decode_rejects_unused_fields() {
    let ctl = |pkt_type, f: &dyn Fn(&mut Header)| {
        let mut h = Header {
            pkt_type,
            req_type: 0,
            dest_session: 0,
            src_session: 0,
            msg_size: 0,
            pkt_num: 0,
            payload_len: 0,
            req_num: 0,
        };
        f(&mut h);
        Header::decode(&wire(&h))
    };
    let r = |field| Err(E::Reserved { field });
    use PktType::*;
    assert_eq!(ctl(CreditReturn, &|h| h.payload_len = 1), r("payload_len"));
    assert_eq!(ctl(Rfr, &|h| h.req_type = 1), r("req_type"));
    assert_eq!(ctl(ConnectReq, &|h| h.dest_session = 1), r("dest_session"));
    assert_eq!(ctl(ConnectResp, &|h| h.msg_size = 1), r("msg_size"));
    assert_eq!(ctl(DisconnectReq, &|h| h.pkt_num = 1), r("pkt_num"));
    assert_eq!(ctl(DisconnectResp, &|h| h.req_type = 2), r("req_type"));
    assert_eq!(ctl(ConnectResp, &|h| h.req_type = 4), Err(E::Status(4)));
    assert!(ctl(ConnectResp, &|h| h.req_type = MAX_STATUS).is_ok());
    assert_eq!(ctl(Rfr, &|_| ()), Err(E::PktNum(0)));
    assert!(ctl(CreditReturn, &|_| ()).is_ok());
}

#[test]
fn validate_rejects() {
    let v = |h: Header| h.validate(&LIMITS);
    assert_eq!(
        v(Header {
            dest_session: 4,
            ..req(0, 0, 0)
        }),
        Err(E::Session(4))
    );
    let connect = Header {
        pkt_type: PktType::ConnectReq,
        dest_session: 0,
        msg_size: 1024,
        ..req(0, 0, 0)
    };
    assert_eq!(v(connect), Ok(()));
    assert_eq!(
        v(req(4097, 0, 1000)),
        Err(E::TooLarge {
            size: 4097,
            max: 4096
        })
    );
    assert_eq!(
        v(req(u32::MAX, 0, 1000)),
        Err(E::TooLarge {
            size: u32::MAX,
            max: 4096
        })
    );
    assert_eq!(v(req(2500, 3, 0)), Err(E::PktNum(3)));
    assert_eq!(v(req(0, 1, 0)), Err(E::PktNum(1)));
    assert_eq!(
        v(req(2500, 1, 500)),
        Err(E::PktLength {
            expected: 1000,
            got: 500
        })
    );
    assert_eq!(
        v(req(2500, 2, 1000)),
        Err(E::PktLength {
            expected: 500,
            got: 1000
        })
    );
    assert_eq!(v(req(0, 0, 0)), Ok(()));
    assert_eq!(v(req(4096, 4, 96)), Ok(()));
    let cr = |pkt_num| Header {
        pkt_type: PktType::CreditReturn,
        req_type: 0,
        msg_size: 0,
        payload_len: 0,
        pkt_num,
        ..req(0, 0, 0)
    };
    assert_eq!(v(cr(4)), Ok(()));
    assert_eq!(v(cr(5)), Err(E::PktNum(5)));
    assert_eq!(
        v(Header {
            pkt_type: PktType::Rfr,
            ..cr(5)
        }),
        Err(E::PktNum(5))
    );
}

#[test]
fn packet_arithmetic() {
    assert_eq!(LIMITS.num_pkts(0), 1);
    assert_eq!(LIMITS.num_pkts(1000), 1);
    assert_eq!(LIMITS.num_pkts(1001), 2);
    assert_eq!(LIMITS.pkt_len(0, 0), 0);
    assert_eq!(LIMITS.pkt_len(2500, 2), 500);
    assert_eq!(LIMITS.pkt_len(2500, 7), 0);
    assert_eq!(num_pkts(usize::MAX, 1), usize::MAX);
}

#[test]
fn errors_display() {
    for e in [
        E::Truncated { len: 1 },
        E::Magic(1),
        E::Version(2),
        E::PktType(0),
        E::Reserved { field: "x" },
        E::Status(9),
        E::PktNum(3),
        E::Session(5),
    ] {
        assert!(!e.to_string().is_empty());
    }
}
