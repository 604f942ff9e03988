//! Arbitrary bytes through `Endpoint::decode`; see `zverbs_fuzz::endpoint`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zverbs_fuzz::endpoint::check(data));
