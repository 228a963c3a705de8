#![no_main]
//! libFuzzer entry for [`sluice_fuzz::sluice_v1`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::sluice_v1(data));
