#![no_main]
//! libFuzzer entry for [`sluice_fuzz::rules_file`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::rules_file(data));
