#![no_main]
//! libFuzzer entry for [`sluice_fuzz::http_body`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::http_body(data));
