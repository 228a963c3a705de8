#![no_main]
//! libFuzzer entry for [`sluice_fuzz::envoy_rls`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::envoy_rls(data));
