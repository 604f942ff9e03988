//! Structured operation sequences on two connected simulated channels; see
//! `zverbs_fuzz::sim_ops`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zverbs_fuzz::sim_ops::run_bytes(data));
