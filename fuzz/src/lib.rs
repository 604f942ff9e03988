//! Fuzz targets for zverbs, as plain functions so that they run both under cargo-fuzz
//! (`fuzz_targets/*.rs`) and as ordinary tests over the committed seeds (`tests/seeds.rs`).
//!
//! - [`endpoint`]: target `endpoint_decode`, the endpoint wire format.
//! - [`sim_ops`]: target `sim_ops`, operation sequences on two simulated channels, checked
//!   against the reference [`model`].
//! - [`exchange_frame`]: target `exchange_frame`, the out-of-band exchange frame.
//! - [`network_config`]: target `network_config`, the JSON network configuration.
//! - [`rpc_header`]: target `rpc_header`, the RPC packet header and packets into RPC
//!   endpoints.
//!
//! [`alloc_track`] installs a counting global allocator (used by `exchange_frame`).

pub mod alloc_track;
pub mod endpoint;
pub mod exchange_frame;
pub mod model;
pub mod network_config;
pub mod rpc_header;
pub mod sim_ops;
