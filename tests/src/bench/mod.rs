//! `cargo xtask bench`: the data path and the control plane, each figure a ratio to a floor
//! measured beside it in the same run.
pub mod baselines;
pub mod charts;
pub mod controlplane;
pub mod datapath;
pub mod floor;
pub mod kernel;
pub mod listing;
pub mod outside;
pub mod report;
pub mod stats;
pub mod world;
