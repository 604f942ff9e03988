//! Out-of-band exchange over TCP: every rank gives one payload (typically its encoded
//! [`Endpoint`](crate::Endpoint)s) and gets everyone else's.
//!
//! Three layers, each usable alone:
//!
//! - [`config`]: a JSON network configuration (`{"nodes":[{"rank":0,"address":"10.0.0.1",
//!   "port":7000}, ...]}`), checked into a [`NetworkConfig`]: ranks exactly `0..n`, unique
//!   unicast IP addresses and ports, every error naming the offending entry.
//! - [`frame`]: a checked, versioned frame (`"ZVEX"`, version, rank, length, payload) whose
//!   decoder never allocates more than [`MAX_PAYLOAD`] bytes, whatever a peer claims.
//! - [`tcp`]: [`exchange`]: all-to-all over TCP, with one deadline bounding every connect,
//!   read and write.
//! - [`rendezvous`]: [`Rendezvous::all_gather`]: the same gathered through a root, rank 0,
//!   over `N - 1` connections.
//! - [`launch`]: the rank, world size and root a launcher (Slurm, Open MPI, MPICH, PMIx,
//!   torchrun, or `ZVERBS_*`) gives the process in its environment.
//! - [`Bootstrap`]: all of it in one value — rank, world, and where the ranks meet (a
//!   rendezvous, or a configuration).
//!
//! ```no_run
//! use std::time::Duration;
//! use zverbs::bootstrap::{exchange, parse_config};
//!
//! let config = parse_config(r#"{"nodes":[
//!     {"rank":0,"address":"10.0.0.1","port":7000},
//!     {"rank":1,"address":"10.0.0.2","port":7000}]}"#)?;
//! let all = exchange(&config, 0, b"my endpoint bytes", Duration::from_secs(30))?;
//! assert_eq!(all[0], b"my endpoint bytes");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod config;
mod conn;
mod error;
pub mod frame;
pub mod launch;
mod meeting;
pub mod rendezvous;
pub mod tcp;

pub use config::{parse_config, ConfigError, NetworkConfig};
pub use error::ExchangeError;
pub use frame::{
    decode_frame, encode_frame, read_frame, FrameError, FRAME_HEADER_LEN, FRAME_MAGIC,
    FRAME_VERSION, MAX_PAYLOAD,
};
pub use meeting::{Bootstrap, Meeting};
pub use rendezvous::{Rendezvous, Routed, MAX_RENDEZVOUS_PAYLOAD};
pub use tcp::{exchange, exchange_with_listener};
