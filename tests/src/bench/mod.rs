//! `cargo xtask bench`: the data path against kube-proxy's layouts, and the control plane, in
//! one run, with a Markdown report and SVG charts under target/bench/.
pub mod baselines;
pub mod controlplane;
pub mod datapath;
pub mod report;
pub mod stats;
pub mod world;
