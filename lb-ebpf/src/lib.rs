//! Empty library target: lb-userspace declares a build-dependency on this crate so cargo
//! rebuilds it when the programs' sources change (aya-build builds the binary itself).
#![no_std]
