//! The exchange frame: one rank's payload, checked and versioned.
//!
//! Wire format, version 1, integers big-endian:
//!
//! | offset | size     | field                              |
//! |-------:|---------:|------------------------------------|
//! | 0      | 4        | magic `"ZVEX"`                     |
//! | 4      | 2        | version (1)                        |
//! | 6      | 4        | sender's rank                      |
//! | 10     | 4        | payload length (≤ [`MAX_PAYLOAD`]) |
//! | 14     | length   | payload                            |
//!
//! Decoders check each field as soon as its bytes are there, so a bad magic is reported
//! after 4 bytes, and a length claim over [`MAX_PAYLOAD`] is rejected before anything is
//! allocated for it: never allocate what a peer claims.
//!
//! ```
//! use zverbs::bootstrap::{decode_frame, encode_frame, FrameError};
//! let mut buf = Vec::new();
//! encode_frame(3, b"hello", &mut buf)?;
//! let (rank, payload, used) = decode_frame(&buf)?;
//! assert_eq!((rank, payload, used), (3, &b"hello"[..], buf.len()));
//! assert!(matches!(decode_frame(&buf[..7]), Err(FrameError::Truncated { .. })));
//! # Ok::<(), FrameError>(())
//! ```

use std::fmt;
use std::io::{self, Read};

/// Magic bytes that open a frame.
pub const FRAME_MAGIC: [u8; 4] = *b"ZVEX";
/// The frame format version this library writes and reads.
pub const FRAME_VERSION: u16 = 1;
/// Length of the frame header (everything before the payload).
pub const FRAME_HEADER_LEN: usize = 14;
/// Largest payload a frame may carry (64 KiB). Longer length claims are rejected before
/// allocating.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// Why bytes are not a valid frame.
#[derive(Debug)]
#[non_exhaustive]
pub enum FrameError {
    /// The magic is not `"ZVEX"`.
    BadMagic([u8; 4]),
    /// A version this library does not read.
    UnsupportedVersion(u16),
    /// The payload length is above [`MAX_PAYLOAD`] (claimed by a peer, or given to
    /// [`encode_frame`]).
    Oversized {
        /// Length claimed or given.
        claimed: u64,
        /// [`MAX_PAYLOAD`].
        max: usize,
    },
    /// The bytes (or the stream) ended inside the frame.
    Truncated {
        /// Bytes the frame needs, as far as known (the header, or header and payload).
        needed: usize,
        /// Bytes there were.
        got: usize,
    },
    /// Reading failed ([`read_frame`] only).
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(f, "bad frame magic {m:02x?}"),
            FrameError::UnsupportedVersion(v) => write!(
                f,
                "frame version {v} unsupported (this library reads {FRAME_VERSION})"
            ),
            FrameError::Oversized { claimed, max } => {
                write!(
                    f,
                    "frame payload of {claimed} bytes exceeds the {max}-byte limit"
                )
            }
            FrameError::Truncated { needed, got } => {
                write!(f, "frame truncated: {got} of {needed} bytes")
            }
            FrameError::Io(e) => write!(f, "reading frame: {e}"),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Appends the frame for `payload`, sent by `rank`, to `out`.
///
/// Fails with [`FrameError::Oversized`] (leaving `out` untouched) if the payload is longer
/// than [`MAX_PAYLOAD`].
pub fn encode_frame(rank: u32, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
    let len = check_len(payload.len() as u64)?;
    out.reserve(FRAME_HEADER_LEN + payload.len());
    out.extend_from_slice(&FRAME_MAGIC);
    out.extend_from_slice(&FRAME_VERSION.to_be_bytes());
    out.extend_from_slice(&rank.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

fn check_len(claimed: u64) -> Result<u32, FrameError> {
    match u32::try_from(claimed) {
        Ok(len) if claimed <= MAX_PAYLOAD as u64 => Ok(len),
        _ => Err(FrameError::Oversized {
            claimed,
            max: MAX_PAYLOAD,
        }),
    }
}

/// Checks the header fields present in `h` (a prefix of a header, up to
/// [`FRAME_HEADER_LEN`] bytes) in wire order. Returns `(rank, payload length)` once the
/// whole header is there and valid, `None` if it is valid so far but incomplete.
pub(crate) fn check_header(h: &[u8]) -> Result<Option<(u32, usize)>, FrameError> {
    if let Some(m) = h.get(0..4) {
        let magic = [m[0], m[1], m[2], m[3]];
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
    }
    if let Some(v) = h.get(4..6) {
        let version = u16::from_be_bytes([v[0], v[1]]);
        if version != FRAME_VERSION {
            return Err(FrameError::UnsupportedVersion(version));
        }
    }
    let Some(tail) = h.get(6..FRAME_HEADER_LEN) else {
        return Ok(None);
    };
    let rank = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let len = u32::from_be_bytes([tail[4], tail[5], tail[6], tail[7]]);
    let len = check_len(u64::from(len))?;
    Ok(Some((rank, len as usize)))
}

/// Decodes the frame at the start of `bytes`: `(rank, payload, bytes consumed)`.
///
/// Pure and total (no I/O, no allocation, no panic), for fuzzing. Bytes after the frame
/// are ignored; `consumed` says where the next one starts.
pub fn decode_frame(bytes: &[u8]) -> Result<(u32, &[u8], usize), FrameError> {
    let header = &bytes[..bytes.len().min(FRAME_HEADER_LEN)];
    let Some((rank, len)) = check_header(header)? else {
        return Err(FrameError::Truncated {
            needed: FRAME_HEADER_LEN,
            got: bytes.len(),
        });
    };
    let end = FRAME_HEADER_LEN + len;
    match bytes.get(FRAME_HEADER_LEN..end) {
        Some(payload) => Ok((rank, payload, end)),
        None => Err(FrameError::Truncated {
            needed: end,
            got: bytes.len(),
        }),
    }
}

/// Reads into `buf` until it is full or the stream ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads one frame from `r`: `(rank, payload)`.
///
/// Fields are checked as they arrive (a peer sending a bad magic is rejected after 4
/// bytes, without waiting for more), and the payload buffer is allocated only once its
/// length is known to be at most [`MAX_PAYLOAD`]. Bound a socket's reads with
/// `set_read_timeout` so that a silent peer cannot block this forever.
pub fn read_frame(r: &mut impl Read) -> Result<(u32, Vec<u8>), FrameError> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    // Field boundaries: magic, version, rank and length.
    for end in [4, 6, FRAME_HEADER_LEN] {
        let n = read_full(r, &mut header[got..end]).map_err(FrameError::Io)?;
        got += n;
        check_header(&header[..got])?;
        if got < end {
            return Err(FrameError::Truncated {
                needed: FRAME_HEADER_LEN,
                got,
            });
        }
    }
    let Some((rank, len)) = check_header(&header)? else {
        // Unreachable: the whole header was read and checked above.
        return Err(FrameError::Truncated {
            needed: FRAME_HEADER_LEN,
            got,
        });
    };
    let mut payload = vec![0u8; len];
    let n = read_full(r, &mut payload).map_err(FrameError::Io)?;
    if n < len {
        return Err(FrameError::Truncated {
            needed: FRAME_HEADER_LEN + len,
            got: FRAME_HEADER_LEN + n,
        });
    }
    Ok((rank, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(rank: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        encode_frame(rank, payload, &mut b).unwrap();
        b
    }

    #[test]
    fn layout_is_pinned() {
        let b = frame(0x0102_0304, b"xy");
        assert_eq!(
            b,
            [b'Z', b'V', b'E', b'X', 0, 1, 1, 2, 3, 4, 0, 0, 0, 2, b'x', b'y']
        );
    }

    #[test]
    fn round_trip_slice_and_reader() {
        for payload in [&b""[..], b"a", &[7u8; MAX_PAYLOAD][..]] {
            let mut b = frame(9, payload);
            let n = b.len();
            b.extend_from_slice(b"trailing");
            assert_eq!(decode_frame(&b).unwrap(), (9, payload, n));
            let mut r = &b[..];
            assert_eq!(read_frame(&mut r).unwrap(), (9, payload.to_vec()));
            assert_eq!(r, b"trailing");
        }
    }

    #[test]
    fn encode_rejects_oversized_and_appends() {
        let mut out = vec![1, 2];
        let big = vec![0u8; MAX_PAYLOAD + 1];
        assert!(matches!(
            encode_frame(0, &big, &mut out),
            Err(FrameError::Oversized { claimed, max: MAX_PAYLOAD }) if claimed == MAX_PAYLOAD as u64 + 1
        ));
        assert_eq!(out, [1, 2]);
        encode_frame(0, b"", &mut out).unwrap();
        assert_eq!(out.len(), 2 + FRAME_HEADER_LEN);
    }

    #[test]
    fn each_error() {
        let good = frame(1, b"abc");
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            b
        };
        let both = |b: &[u8]| (decode_frame(b).map(|_| ()), read_frame(&mut &b[..]));

        let bad_magic = with(0, b'Q');
        let (s, r) = both(&bad_magic);
        assert!(matches!(s, Err(FrameError::BadMagic(m)) if &m == b"QVEX"));
        assert!(matches!(r, Err(FrameError::BadMagic(m)) if &m == b"QVEX"));
        // Reported from the magic alone.
        assert!(matches!(
            read_frame(&mut &bad_magic[..4]),
            Err(FrameError::BadMagic(_))
        ));
        assert!(matches!(
            decode_frame(&bad_magic[..4]),
            Err(FrameError::BadMagic(_))
        ));

        let (s, r) = both(&with(5, 2));
        assert!(matches!(s, Err(FrameError::UnsupportedVersion(2))));
        assert!(matches!(r, Err(FrameError::UnsupportedVersion(2))));

        let mut huge = good[..FRAME_HEADER_LEN].to_vec();
        huge[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
        let (s, r) = both(&huge);
        let max = MAX_PAYLOAD;
        assert!(
            matches!(s, Err(FrameError::Oversized { claimed, max: m }) if claimed == u64::from(u32::MAX) && m == max)
        );
        assert!(matches!(r, Err(FrameError::Oversized { .. })));

        for cut in [0, 3, 5, 13] {
            let (s, r) = both(&good[..cut]);
            assert!(
                matches!(s, Err(FrameError::Truncated { needed: FRAME_HEADER_LEN, got }) if got == cut)
            );
            assert!(
                matches!(r, Err(FrameError::Truncated { needed: FRAME_HEADER_LEN, got }) if got == cut)
            );
        }
        let (s, r) = both(&good[..good.len() - 1]);
        assert!(matches!(
            s,
            Err(FrameError::Truncated {
                needed: 17,
                got: 16
            })
        ));
        assert!(matches!(
            r,
            Err(FrameError::Truncated {
                needed: 17,
                got: 16
            })
        ));

        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::ConnectionReset, "gone"))
            }
        }
        let e = read_frame(&mut Broken).unwrap_err();
        assert!(matches!(&e, FrameError::Io(io) if io.kind() == io::ErrorKind::ConnectionReset));
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn reader_survives_one_byte_reads() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let Some((&b, rest)) = self.0.split_first() else {
                    return Ok(0);
                };
                if buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = b;
                self.0 = rest;
                Ok(1)
            }
        }
        let b = frame(u32::MAX, b"slow");
        assert_eq!(
            read_frame(&mut Trickle(&b)).unwrap(),
            (u32::MAX, b"slow".to_vec())
        );
    }

    #[test]
    fn messages_name_the_problem() {
        let e = FrameError::Oversized {
            claimed: 1 << 32,
            max: MAX_PAYLOAD,
        };
        assert!(e.to_string().contains("4294967296"), "{e}");
        assert!(FrameError::UnsupportedVersion(7).to_string().contains('7'));
    }

    /// Mostly-valid inputs: a good frame, a few bytes overwritten, maybe cut short.
    fn near_valid() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec((0usize..80, any::<u8>()), 0..3),
            0usize..150,
        )
            .prop_map(|(rank, payload, edits, cut)| {
                let mut b = frame(rank, &payload);
                for (i, v) in edits {
                    if let Some(x) = b.get_mut(i) {
                        *x = v;
                    }
                }
                // A third of the cases keep the whole frame; the rest are cut short.
                b.truncate(b.len() * cut / 100);
                b
            })
    }

    proptest! {
        #[test]
        fn decode_never_panics_and_ok_reencodes(
            b in prop_oneof![proptest::collection::vec(any::<u8>(), 0..64), near_valid()]
        ) {
            let from_slice = decode_frame(&b);
            let from_reader = read_frame(&mut &b[..]);
            match (&from_slice, &from_reader) {
                (Ok((rank, payload, used)), Ok((r2, p2))) => {
                    prop_assert_eq!(&frame(*rank, payload)[..], &b[..*used]);
                    prop_assert_eq!((rank, payload), (r2, &&p2[..]));
                }
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "slice and reader disagree: {:?} vs {:?}", from_slice, from_reader),
            }
        }

        #[test]
        fn valid_frames_round_trip(rank: u32, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let b = frame(rank, &payload);
            prop_assert_eq!(decode_frame(&b).unwrap(), (rank, &payload[..], b.len()));
        }
    }
}
