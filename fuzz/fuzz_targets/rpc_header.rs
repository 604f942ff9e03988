//! Arbitrary bytes through `rpc::Header::decode` and two RPC endpoints; see
//! `zverbs_fuzz::rpc_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zverbs_fuzz::rpc_header::check(data));
