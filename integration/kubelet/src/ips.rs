//! Loopback Pod IPs: one fresh address per Pod incarnation.
//!
//! Addresses are handed out in increasing order over a configured range of 127.0.0.0/8 and wrap
//! around only at the end of the range, skipping every address still in use. A recreated Pod
//! therefore gets a new IP (as in a real cluster), and no address is ever shared by two live Pods.
//! Addresses ending in .0 or .255 are skipped to avoid confusing anyone reading them.

use std::collections::HashSet;
use std::net::Ipv4Addr;

/// Allocator over an inclusive range of loopback addresses.
#[derive(Debug)]
pub struct IpAllocator {
    first: u32,
    last: u32,
    next: u32,
    in_use: HashSet<u32>,
}

/// Parses `127.A.B.C/len` into an inclusive (first, last) range of loopback hosts.
pub fn parse_range(cidr: &str) -> Result<(Ipv4Addr, Ipv4Addr), String> {
    let (addr, len) = cidr
        .split_once('/')
        .ok_or_else(|| format!("pod IP range {cidr:?}: expected 127.A.B.C/LEN"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|e| format!("pod IP range {cidr:?}: {e}"))?;
    let len: u32 = len
        .parse()
        .map_err(|e| format!("pod IP range {cidr:?}: {e}"))?;
    if !(8..=30).contains(&len) || addr.octets()[0] != 127 {
        return Err(format!(
            "pod IP range {cidr:?} must lie in 127.0.0.0/8 with a prefix of 8..=30"
        ));
    }
    let mask = u32::MAX << (32 - len);
    let network = u32::from(addr) & mask;
    let broadcast = network | !mask;
    Ok((Ipv4Addr::from(network + 1), Ipv4Addr::from(broadcast - 1)))
}

impl IpAllocator {
    /// An allocator over `first..=last`.
    pub fn new(first: Ipv4Addr, last: Ipv4Addr) -> Self {
        let (first, last) = (u32::from(first), u32::from(last));
        Self {
            first,
            last,
            next: first,
            in_use: HashSet::new(),
        }
    }

    fn usable(&self, candidate: u32) -> bool {
        let low = candidate & 0xff;
        low != 0 && low != 255 && !self.in_use.contains(&candidate)
    }

    /// A fresh address, or `None` when the whole range is in use.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        let size = self.last - self.first + 1;
        for _ in 0..size {
            let candidate = self.next;
            self.next = if self.next >= self.last {
                self.first
            } else {
                self.next + 1
            };
            if self.usable(candidate) {
                self.in_use.insert(candidate);
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    /// Marks an address as in use (a Pod adopted after a kubelet restart keeps its IP).
    /// Returns false when it is outside the range or already taken.
    pub fn claim(&mut self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        if v < self.first || v > self.last {
            return false;
        }
        let claimed = self.in_use.insert(v);
        if claimed && v >= self.next {
            self.next = if v >= self.last { self.first } else { v + 1 };
        }
        claimed
    }

    /// Continues handing out addresses after `ip` (the last one given by a previous run).
    pub fn resume_after(&mut self, ip: Ipv4Addr) {
        let v = u32::from(ip);
        if v >= self.first && v < self.last {
            self.next = v + 1;
        }
    }

    /// Returns an address to the pool; it is handed out again only after the range wraps.
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.in_use.remove(&u32::from(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_addresses_are_not_reused_until_the_range_wraps() {
        let (first, last) = parse_range("127.1.0.0/16").unwrap();
        assert_eq!(first, Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(last, Ipv4Addr::new(127, 1, 255, 254));
        let mut ips = IpAllocator::new(first, last);
        let a = ips.allocate().unwrap();
        ips.release(a);
        let b = ips.allocate().unwrap();
        assert_eq!(a, Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(b, Ipv4Addr::new(127, 1, 0, 2));
    }

    #[test]
    fn allocation_skips_addresses_in_use_and_dot_zero_and_dot_255() {
        let mut ips = IpAllocator::new(Ipv4Addr::new(127, 2, 0, 253), Ipv4Addr::new(127, 2, 1, 2));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 2, 0, 253)));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 2, 0, 254)));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 2, 1, 1)));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 2, 1, 2)));
        // wrapped: .253 and .254 are still in use, .255/.0 are never used
        assert_eq!(ips.allocate(), None);
        ips.release(Ipv4Addr::new(127, 2, 0, 254));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 2, 0, 254)));
    }

    #[test]
    fn claimed_addresses_are_skipped() {
        let mut ips = IpAllocator::new(Ipv4Addr::new(127, 3, 0, 1), Ipv4Addr::new(127, 3, 0, 9));
        assert!(ips.claim(Ipv4Addr::new(127, 3, 0, 1)));
        assert!(!ips.claim(Ipv4Addr::new(127, 3, 0, 1)));
        assert!(!ips.claim(Ipv4Addr::new(127, 4, 0, 1)));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 3, 0, 2)));
    }

    #[test]
    fn a_restarted_allocator_resumes_after_the_last_address_given() {
        let mut ips = IpAllocator::new(Ipv4Addr::new(127, 3, 0, 1), Ipv4Addr::new(127, 3, 0, 9));
        ips.resume_after(Ipv4Addr::new(127, 3, 0, 4));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 3, 0, 5)));
        ips.resume_after(Ipv4Addr::new(127, 9, 0, 4));
        assert_eq!(ips.allocate(), Some(Ipv4Addr::new(127, 3, 0, 6)));
    }

    #[test]
    fn ranges_outside_loopback_are_rejected() {
        assert!(parse_range("10.0.0.0/16").is_err());
        assert!(parse_range("127.0.0.0/4").is_err());
        assert!(parse_range("127.0.0.0").is_err());
    }
}
