//! A control byte and a byte stream through the exchange frame decoders; see
//! `zverbs_fuzz::exchange_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| zverbs_fuzz::exchange_frame::check(data));
