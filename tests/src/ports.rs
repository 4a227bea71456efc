//! Loopback ports for servers the tests start as other processes (etcd,
//! kube-apiserver, the webhook). A port found by binding port 0 and
//! released for the server to bind can be taken in between: by another
//! test's server, or by any outgoing connection, which the kernel gives a
//! port from the same ephemeral range. These come from outside that range
//! (so no outgoing connection takes one), each at most once per process,
//! and each was free when handed out.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::Mutex;

/// The kernel's ephemeral range when `/proc` does not say (Linux's default).
const EPHEMERAL_DEFAULT: (u32, u32) = (32768, 60999);

/// `N` distinct loopback ports, free when chosen.
pub fn reserve<const N: usize>() -> [u16; N] {
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let window = window(ephemeral_range());
    let len = window.end - window.start;
    let mut next = NEXT.lock().unwrap_or_else(|p| p.into_inner());
    // Processes start at different places, so parallel test binaries rarely meet.
    let mut cursor = next.unwrap_or_else(|| std::process::id().wrapping_mul(7919) % len);
    let mut held: Vec<TcpListener> = Vec::with_capacity(N);
    let mut tried = 0;
    while held.len() < N {
        assert!(tried < len, "no free loopback port in {window:?}");
        let port = window.start + cursor;
        cursor = (cursor + 1) % len;
        tried += 1;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port as u16)) {
            held.push(listener);
        }
    }
    *next = Some(cursor);
    std::array::from_fn(|i| held[i].local_addr().map(|a| a.port()).unwrap_or_default())
}

/// `/proc/sys/net/ipv4/ip_local_port_range`.
fn ephemeral_range() -> (u32, u32) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut numbers = text.split_whitespace().filter_map(|n| n.parse().ok());
    match (numbers.next(), numbers.next()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => EPHEMERAL_DEFAULT,
    }
}

/// Ports below the ephemeral range (from 10000, clear of the well-known
/// ones), or above it when it starts too low.
fn window((low, high): (u32, u32)) -> Range<u32> {
    if low >= 12_000 { 10_000..low } else { (high + 1).min(65_535)..65_536 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (low, high) = ephemeral_range();
        let a: [u16; 5] = reserve();
        let b: [u16; 5] = reserve();
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        for port in &all {
            assert!(u32::from(*port) < low || u32::from(*port) > high, "{port} in {low}..={high}");
            TcpListener::bind(("127.0.0.1", *port)).expect("free");
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10, "each port once: {a:?} {b:?}");
    }

    #[test]
    fn the_window_avoids_the_range() {
        assert_eq!(window((32768, 60999)), 10_000..32768);
        assert_eq!(window((1024, 60999)), 61_000..65_536);
    }
}
