//! Arbitrary bytes through the network configuration parser; see
//! `zverbs_fuzz::network_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zverbs_fuzz::network_config::check(data));
