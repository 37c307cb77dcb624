//! Parsers for what real tools print. Each is tested on captured real output.

// Used by the softroce fabric and the vm backend, which land after the parsers.
#[allow(dead_code)]
pub mod ibv_devinfo;
pub mod iperf3;
#[allow(dead_code)]
pub mod perftest;
