//! PCI addresses and the PCIe root they hang off.

use std::fmt;

use serde::Serialize;

/// A PCI function address (domain:bus:device.function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciBusId {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PCI bus id {value:?} is not of the form DOMAIN:BUS:DEVICE.FUNCTION in hexadecimal (e.g. 0000:65:00.0)")]
pub struct InvalidPciBusId {
    pub value: String,
}

impl PciBusId {
    /// Reads `0000:65:00.0` or NVML's `00000000:65:00.0`, in either case.
    pub fn parse(s: &str) -> Result<Self, InvalidPciBusId> {
        let invalid = || InvalidPciBusId { value: s.to_string() };
        let (domain, rest) = s.split_once(':').ok_or_else(invalid)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(invalid)?;
        let (device, function) = rest.split_once('.').ok_or_else(invalid)?;
        let hex = |p: &str, max_len: usize| {
            if p.is_empty() || p.len() > max_len || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(invalid());
            }
            u32::from_str_radix(p, 16).map_err(|_| invalid())
        };
        let domain = hex(domain, 8)?;
        let bus = hex(bus, 2)?;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 0x1f || function > 7 {
            return Err(invalid());
        }
        Ok(Self { domain, bus: bus as u8, device: device as u8, function: function as u8 })
    }

    /// The value of `resource.kubernetes.io/pciBusID`, which Kubernetes
    /// defines as exactly `^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`;
    /// `None` for domains beyond 16 bits (Intel VMD), which it cannot express.
    pub fn standard_attribute(&self) -> Option<String> {
        (self.domain <= 0xffff).then(|| self.to_string())
    }
}

impl fmt::Display for PciBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl Serialize for PciBusId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The PCIe root of a device from the target of its
/// `/sys/bus/pci/devices/<bdf>` symlink, e.g.
/// `../../../devices/pci0000:64/0000:64:01.0/0000:65:00.0` gives `pci0000:64`
/// (the first path element under `devices/`, as Kubernetes' `deviceattribute`
/// package reads it).
pub fn pcie_root_from_sysfs_link(target: &str, bus_id: &PciBusId) -> Option<String> {
    let mut parts = target.split('/').skip_while(|p| *p != "devices").skip(1);
    let root = parts.next()?;
    let last = target.rsplit('/').next()?;
    let is_root = root.starts_with("pci") && root.len() > 3;
    let ends_with_device = PciBusId::parse(last).is_ok_and(|id| id == *bus_id);
    (is_root && ends_with_device).then(|| root.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvml_and_standard_forms() {
        let a = PciBusId::parse("00000000:65:00.0").unwrap();
        let b = PciBusId::parse("0000:65:00.0").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "0000:65:00.0");
        assert_eq!(PciBusId::parse("0000:AB:1F.7").unwrap().to_string(), "0000:ab:1f.7");
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in ["", "65:00.0", "0000:65:00", "0000:65:20.0", "0000:65:00.8", "zz:65:00.0", "0000:165:00.0"] {
            assert!(PciBusId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wide_domains_have_no_standard_attribute() {
        let vmd = PciBusId::parse("00010000:e1:00.0").unwrap();
        assert_eq!(vmd.standard_attribute(), None);
        assert_eq!(PciBusId::parse("0000:e1:00.0").unwrap().standard_attribute().as_deref(), Some("0000:e1:00.0"));
    }

    #[test]
    fn pcie_root_from_link() {
        let id = PciBusId::parse("0000:65:00.0").unwrap();
        assert_eq!(
            pcie_root_from_sysfs_link("../../../devices/pci0000:64/0000:64:01.0/0000:65:00.0", &id).as_deref(),
            Some("pci0000:64")
        );
        assert_eq!(pcie_root_from_sysfs_link("../../../devices/pci0000:64/0000:64:01.0/0000:66:00.0", &id), None);
        assert_eq!(pcie_root_from_sysfs_link("../../../devices/platform/x/0000:65:00.0", &id), None);
    }
}
