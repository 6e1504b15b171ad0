#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| llaisys_fuzz::dialect_request(data));
