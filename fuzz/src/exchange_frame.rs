//! Target `exchange_frame`: the out-of-band exchange frame (`zverbs::bootstrap`:
//! `decode_frame`, `read_frame`, `encode_frame`).
//!
//! Input: one control byte, then the bytes of a stream. The control byte says how a
//! reader delivers the stream to `read_frame`: at most `c & 0x0f` bytes per read (0: all
//! that is asked), `Interrupted` before every other read (`c & 0x10`), and an I/O error
//! instead of end-of-stream (`c & 0x20`); bits `0x40` / `0x80` add the encoder's boundary
//! cases (a payload of `MAX_PAYLOAD + 1` / exactly `MAX_PAYLOAD` bytes).
//!
//! Invariants, for any input:
//! - `decode_frame` does not panic, allocates nothing, and agrees exactly (value or error)
//!   with a reference decoder written from the format table in `src/node/exchange/frame.rs`;
//! - `read_frame` over the same stream, however it is delivered, agrees with it: the same
//!   rank and payload, having read exactly the frame's bytes (not one more); or the same
//!   error, except that a stream failing where it would end gives `Io` where the slice gives
//!   `Truncated`;
//! - `read_frame` never allocates more than `MAX_PAYLOAD` bytes at once, nor much more in
//!   total, whatever length the frame claims;
//! - an accepted frame re-encodes to exactly its bytes; `encode_frame` of a rank and payload
//!   taken from the input appends exactly one frame that decodes back to them, and refuses
//!   a payload over `MAX_PAYLOAD` without touching its output;
//! - every error displays without panicking.

use std::io::{self, Read};

use zverbs::bootstrap::{
    decode_frame, encode_frame, read_frame, FrameError, FRAME_HEADER_LEN, FRAME_MAGIC,
    FRAME_VERSION, MAX_PAYLOAD,
};

use crate::alloc_track::measure;

/// What the format table says bytes decode to.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect<'a> {
    /// A frame: rank, payload, bytes used.
    Frame(u32, &'a [u8], usize),
    /// Wrong magic.
    BadMagic([u8; 4]),
    /// Wrong version.
    Version(u16),
    /// Length claim over `MAX_PAYLOAD`.
    Oversized(u64),
    /// Ends inside the frame: (bytes needed as far as known, bytes there).
    Truncated(usize, usize),
}

/// Decodes by the format table, field by field in wire order (each checked once its bytes
/// are there).
pub fn reference_decode(b: &[u8]) -> Expect<'_> {
    if b.len() >= 4 && b[0..4] != *b"ZVEX" {
        return Expect::BadMagic([b[0], b[1], b[2], b[3]]);
    }
    if b.len() >= 6 {
        let v = u16::from_be_bytes([b[4], b[5]]);
        if v != 1 {
            return Expect::Version(v);
        }
    }
    if b.len() < 14 {
        return Expect::Truncated(14, b.len());
    }
    let rank = u32::from_be_bytes([b[6], b[7], b[8], b[9]]);
    let len = u32::from_be_bytes([b[10], b[11], b[12], b[13]]);
    if len > 64 * 1024 {
        return Expect::Oversized(u64::from(len));
    }
    let end = 14 + len as usize;
    match b.get(14..end) {
        Some(payload) => Expect::Frame(rank, payload, end),
        None => Expect::Truncated(end, b.len()),
    }
}

/// The table's name for an error of `decode_frame` or `read_frame` (`Io` has none).
fn expect_of(e: &FrameError) -> Expect<'static> {
    match e {
        FrameError::BadMagic(m) => Expect::BadMagic(*m),
        FrameError::UnsupportedVersion(v) => Expect::Version(*v),
        FrameError::Oversized { claimed, max } => {
            assert_eq!(*max, MAX_PAYLOAD, "Oversized names the wrong limit");
            Expect::Oversized(*claimed)
        }
        FrameError::Truncated { needed, got } => Expect::Truncated(*needed, *got),
        e => panic!("unexpected frame error {e:?}"),
    }
}

/// A stream delivered as the control byte says.
struct Stream<'a> {
    data: &'a [u8],
    pos: usize,
    chunk: usize,
    interrupt: bool,
    fail_at_end: bool,
    reads: u32,
}

impl Read for Stream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        if self.interrupt && self.reads % 2 == 1 {
            // `from(kind)` does not allocate (the reader runs inside `measure`).
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let left = &self.data[self.pos..];
        if left.is_empty() && !buf.is_empty() && self.fail_at_end {
            return Err(io::Error::from(io::ErrorKind::ConnectionReset));
        }
        let mut n = buf.len().min(left.len());
        if self.chunk > 0 {
            n = n.min(self.chunk);
        }
        buf[..n].copy_from_slice(&left[..n]);
        self.pos += n;
        Ok(n)
    }
}

/// Runs one input.
pub fn check(data: &[u8]) {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };

    // decode_frame: total, allocation-free, and as the table says.
    let (decoded, stats) = measure(|| decode_frame(stream));
    assert_eq!(stats.count, 0, "decode_frame allocated: {stats:?}");
    let want = reference_decode(stream);
    match (&decoded, &want) {
        (Ok((rank, payload, used)), Expect::Frame(r, p, u)) => {
            assert_eq!(
                (rank, payload, used),
                (r, p, u),
                "decode_frame: wrong frame"
            );
            let mut again = Vec::new();
            encode_frame(*rank, payload, &mut again).expect("re-encode an accepted frame");
            assert_eq!(
                &again[..],
                &stream[..*used],
                "accepted frame does not re-encode"
            );
        }
        (Ok(v), _) => panic!("decode_frame accepted {v:?}; the table says {want:?}"),
        (Err(e), _) => {
            let _ = e.to_string();
            assert_eq!(expect_of(e), want, "decode_frame: wrong error {e:?}");
        }
    }

    // read_frame: the same answer, however the bytes arrive.
    let mut s = Stream {
        data: stream,
        pos: 0,
        chunk: usize::from(control & 0x0f),
        interrupt: control & 0x10 != 0,
        fail_at_end: control & 0x20 != 0,
        reads: 0,
    };
    let (read, stats) = measure(|| read_frame(&mut s));
    assert!(
        stats.largest <= MAX_PAYLOAD && stats.bytes <= MAX_PAYLOAD as u64 + 4096,
        "read_frame allocated {stats:?} (limit {MAX_PAYLOAD})"
    );
    match (&read, &want) {
        (Ok((rank, payload)), Expect::Frame(r, p, used)) => {
            assert_eq!((rank, &payload[..]), (r, *p), "read_frame: wrong frame");
            assert_eq!(s.pos, *used, "read_frame read past its frame");
            assert!(stats.largest <= payload.len().max(64), "{stats:?}");
        }
        (Ok(v), _) => panic!("read_frame accepted {v:?}; the table says {want:?}"),
        (Err(FrameError::Io(e)), Expect::Truncated(..)) if s.fail_at_end => {
            assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        }
        (Err(e), _) => {
            let _ = e.to_string();
            assert_eq!(expect_of(e), want, "read_frame: wrong error {e:?}");
        }
    }

    // encode_frame: rank and payload from the input round-trip.
    let rank = stream
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    round_trip(rank, stream);
    if control & 0x40 != 0 {
        let big = vec![control; MAX_PAYLOAD + 1];
        let mut out = vec![1, 2, 3];
        match encode_frame(rank, &big, &mut out) {
            Err(FrameError::Oversized { claimed, max }) => {
                assert_eq!((claimed, max), (MAX_PAYLOAD as u64 + 1, MAX_PAYLOAD));
            }
            r => panic!("encode_frame of {} bytes: {r:?}", big.len()),
        }
        assert_eq!(out, [1, 2, 3], "a refused encode wrote");
    }
    if control & 0x80 != 0 {
        round_trip(rank, &vec![control; MAX_PAYLOAD]);
    }
}

fn round_trip(rank: u32, payload: &[u8]) {
    let mut out = vec![0xA5; 3];
    encode_frame(rank, payload, &mut out).expect("encode a payload within the limit");
    assert_eq!(out.len(), 3 + FRAME_HEADER_LEN + payload.len());
    assert_eq!(&out[..3], &[0xA5; 3], "encode_frame changed what was there");
    assert_eq!(&out[3..7], &FRAME_MAGIC);
    assert_eq!(&out[7..9], &FRAME_VERSION.to_be_bytes());
    let (r, p, used) = decode_frame(&out[3..]).expect("decode what was encoded");
    assert_eq!((r, p, used), (rank, payload, out.len() - 3));
    let (r, p) = read_frame(&mut &out[3..]).expect("read what was encoded");
    assert_eq!((r, &p[..]), (rank, payload));
}
