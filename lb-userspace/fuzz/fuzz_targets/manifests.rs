//! Arbitrary bytes as a manifests file: parsing, validation, translation and reconciliation
//! must never panic, and the maps must stay consistent after every write.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| socklb::fuzzing::manifests(data));
