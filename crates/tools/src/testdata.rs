//! Captured real output kept in this crate (`tests/fixtures/`) that other crates' tests
//! read too: they get it from here, never by a path into this crate.

/// `ibv_devinfo -v` of an rxe device, captured in the vm backend's guest.
pub const IBV_DEVINFO_V_RXE: &str = include_str!("../tests/fixtures/ibv_devinfo_v_rxe.txt");

/// What tcpdump printed of ib_send_lat's TCP exchange (`exchange: tcp`), captured on a
/// lab's cable.
pub const TCPDUMP_SEND_LAT_TCP_EXCHANGE: &str =
    include_str!("../tests/fixtures/tcpdump_send_lat_tcp_exchange.txt");
