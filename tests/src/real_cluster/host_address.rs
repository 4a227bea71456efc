//! A non-loopback address of this machine for an EndpointSlice: the API
//! server reaches a Service-based webhook at its endpoints' addresses
//! (`--enable-aggregator-routing`, there being no kube-proxy), and endpoint
//! validation refuses loopback (127.0.0.0/8) and link-local addresses.
//!
//! The machine's own source address towards any route is taken when there
//! is one (nothing to undo). On a machine with no route at all, an address
//! of the benchmarking range (198.18.0.0/15) is added to `lo` (we run as
//! root) and removed on drop.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::Command;

/// An address the webhook can listen on and the API server can dial.
pub struct HostAddress {
    ip: Ipv4Addr,
    /// Set when this process added `ip` to `lo`: removed on drop.
    added: bool,
}

impl HostAddress {
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Finds one, or adds one to `lo`; panics saying how to give the
    /// machine one when neither works.
    pub fn acquire() -> Self {
        if let Some(ip) = routed_source() {
            return Self { ip, added: false };
        }
        // Unique per process, so parallel test binaries do not share one.
        let n = std::process::id();
        let ip = Ipv4Addr::new(198, 18, ((n >> 8) & 0xff) as u8, (n & 0xfe) as u8 | 1);
        let status = Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", "lo"]).status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "this machine has no non-loopback IPv4 address and `ip addr add {ip}/32 dev lo` failed ({status:?}): \
             the real API server must reach the webhook at a non-loopback address; run as root with iproute2, \
             or give the machine an address"
        );
        Self { ip, added: true }
    }
}

impl HostAddress {
    /// `ip` added to `lo` (a test node's address of its own: the
    /// benchmarking range, 198.18.0.0/15), removed on drop; panics when
    /// `ip addr add` fails (taken, or not root).
    pub fn add_to_loopback(ip: Ipv4Addr) -> Self {
        let status = Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", "lo"]).status();
        assert!(status.as_ref().is_ok_and(|s| s.success()), "`ip addr add {ip}/32 dev lo` failed ({status:?})");
        Self { ip, added: true }
    }
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        if self.added {
            let _ = Command::new("ip").args(["addr", "del", &format!("{}/32", self.ip), "dev", "lo"]).status();
        }
    }
}

/// The source address the kernel picks towards a public address (a UDP
/// "connect" sends nothing), if it is not loopback.
fn routed_source() -> Option<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    match socket.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() && !ip.is_link_local() => Some(ip),
        _ => None,
    }
}
