#![no_main]
//! libFuzzer entry for [`sluice_fuzz::gossip_datagram`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::gossip_datagram(data));
