//! Parsers for what real tools print. Each is tested on captured real output.

pub mod ibdiag;
pub mod ibv_devinfo;
pub mod iperf3;
pub mod iproute;
pub mod ldd;
pub mod netdev;
pub mod perftest;
pub mod rdma;
pub mod tcpdump;
