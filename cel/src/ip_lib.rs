//! IP addresses and CIDR prefixes as CEL values, and the apiserver's IP and
//! CIDR libraries (`k8s.io/apiserver/pkg/cel/library/{ip,cidr}.go`), with
//! Go's `net/netip` rules: no leading zeros in an IPv4 octet, no zone, no
//! IPv4-mapped IPv6 address; addresses print in RFC 5952 form.

use std::any::Any;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cel::common::types::{CelBool, CelInt, CelString, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use crate::meter::{bytes_units, charge};

pub static IP_TYPE: Type = Type::new_unspecified_type("net.IP");
pub static CIDR_TYPE: Type = Type::new_unspecified_type("net.CIDR");

/// Why a text is not an address or prefix the libraries accept, in the
/// apiserver's words, which CEL's `ip()` and `cidr()` errors carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpError {
    /// `netip.ParseAddr` refused the address; `reason` is its message.
    #[error("IP Address {text:?} parse error during conversion from string: {reason}")]
    Address { text: String, reason: String },
    #[error("IP address {text:?} with zone value is not allowed")]
    Zone { text: String },
    #[error("IPv4-mapped IPv6 address {text:?} is not allowed")]
    Ipv4Mapped { text: String },
    /// `netip.ParsePrefix` refused the prefix; Kubernetes wraps its message
    /// in the same words twice.
    #[error(
        "network address parse error during conversion from string: network address parse error during conversion from string: netip.ParsePrefix({text:?}): {reason}"
    )]
    Prefix { text: String, reason: String },
}

/// An IP address as the library accepts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ip(IpAddr);

/// A prefix: an address (not necessarily masked, as written) and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

/// Go's `netip.ParseAddr`, with its error messages: the address and
/// whether it had a zone.
fn parse_addr(input: &str) -> Result<(IpAddr, bool), String> {
    let fail = |msg: &str, at: Option<&str>| match at {
        Some(at) if !at.is_empty() => format!("ParseAddr({input:?}): {msg} (at {at:?})"),
        _ => format!("ParseAddr({input:?}): {msg}"),
    };
    for c in input.bytes() {
        match c {
            b'.' => {
                let mut fields = [0u8; 4];
                parse_ipv4_fields(input, input, &mut fields).map_err(|(msg, at)| fail(msg, at))?;
                return Ok((IpAddr::V4(Ipv4Addr::from(fields)), false));
            }
            b':' => return parse_ipv6(input).map_err(|(msg, at)| fail(msg, at)),
            b'%' => return Err(fail("missing IPv6 address", None)),
            _ => {}
        }
    }
    Err(fail("unable to parse IP", None))
}

type ParseFailure<'a> = (&'static str, Option<&'a str>);

/// Go's `parseIPv4Fields`.
fn parse_ipv4_fields<'a>(_input: &str, s: &'a str, fields: &mut [u8; 4]) -> Result<(), ParseFailure<'a>> {
    let bytes = s.as_bytes();
    let (mut val, mut pos, mut digits) = (0u32, 0usize, 0usize);
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                if digits == 1 && val == 0 {
                    return Err(("IPv4 field has octet with leading zero", None));
                }
                val = val * 10 + u32::from(c - b'0');
                digits += 1;
                if val > 255 {
                    return Err(("IPv4 field has value >255", None));
                }
            }
            b'.' => {
                if i == 0 || i == bytes.len() - 1 || bytes[i - 1] == b'.' {
                    return Err(("IPv4 field must have at least one digit", Some(&s[i..])));
                }
                if pos == 3 {
                    return Err(("IPv4 address too long", None));
                }
                fields[pos] = val as u8;
                pos += 1;
                val = 0;
                digits = 0;
            }
            _ => return Err(("unexpected character", Some(&s[i..]))),
        }
    }
    if pos < 3 {
        return Err(("IPv4 address too short", None));
    }
    fields[3] = val as u8;
    Ok(())
}

/// Go's `parseIPv6`.
fn parse_ipv6(input: &str) -> Result<(IpAddr, bool), ParseFailure<'_>> {
    let (mut s, zone) = match input.split_once('%') {
        Some((_, "")) => return Err(("zone must be a non-empty string", None)),
        Some((address, _)) => (address, true),
        None => (input, false),
    };
    let mut ip = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    if s.starts_with("::") {
        ellipsis = Some(0);
        s = &s[2..];
        if s.is_empty() {
            return Ok((IpAddr::V6(Ipv6Addr::UNSPECIFIED), zone));
        }
    }
    let mut i = 0;
    while i < 16 {
        let bytes = s.as_bytes();
        let (mut off, mut acc) = (0usize, 0u32);
        while off < bytes.len() {
            let digit = match bytes[off] {
                c @ b'0'..=b'9' => c - b'0',
                c @ b'a'..=b'f' => c - b'a' + 10,
                c @ b'A'..=b'F' => c - b'A' + 10,
                _ => break,
            };
            acc = (acc << 4) + u32::from(digit);
            if off > 3 {
                return Err(("each group must have 4 or less digits", Some(s)));
            }
            if acc > 0xffff {
                return Err(("IPv6 field has value >=2^16", Some(s)));
            }
            off += 1;
        }
        if off == 0 {
            return Err(("each colon-separated field must have at least one digit", Some(s)));
        }
        if off < bytes.len() && bytes[off] == b'.' {
            if ellipsis.is_none() && i != 12 {
                return Err(("embedded IPv4 address must replace the final 2 fields of the address", Some(s)));
            }
            if i + 4 > 16 {
                return Err(("too many hex fields to fit an embedded IPv4 at the end of the address", Some(s)));
            }
            let mut fields = [0u8; 4];
            parse_ipv4_fields(input, s, &mut fields)?;
            ip[i..i + 4].copy_from_slice(&fields);
            s = "";
            i += 4;
            break;
        }
        ip[i] = (acc >> 8) as u8;
        ip[i + 1] = acc as u8;
        i += 2;
        s = &s[off..];
        if s.is_empty() {
            break;
        }
        if !s.starts_with(':') {
            return Err(("unexpected character, want colon", Some(s)));
        } else if s.len() == 1 {
            return Err(("colon must be followed by more characters", Some(s)));
        }
        s = &s[1..];
        if s.starts_with(':') {
            if ellipsis.is_some() {
                return Err(("multiple :: in address", Some(s)));
            }
            ellipsis = Some(i);
            s = &s[1..];
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return Err(("trailing garbage after address", Some(s)));
    }
    if i < 16 {
        let Some(at) = ellipsis else { return Err(("address string too short", None)) };
        let n = 16 - i;
        for j in (at..i).rev() {
            ip[j + n] = ip[j];
        }
        ip[at..at + n].fill(0);
    } else if ellipsis.is_some() {
        return Err(("the :: must expand to at least one field of zeros", None));
    }
    Ok((IpAddr::V6(Ipv6Addr::from(ip)), zone))
}

impl Ip {
    /// `parseIPAddr`.
    pub fn parse(raw: &str) -> Result<Ip, IpError> {
        let (addr, zone) = parse_addr(raw).map_err(|reason| IpError::Address { text: raw.to_owned(), reason })?;
        if zone {
            return Err(IpError::Zone { text: raw.to_owned() });
        }
        if let IpAddr::V6(v6) = addr
            && v6.to_ipv4_mapped().is_some()
        {
            return Err(IpError::Ipv4Mapped { text: raw.to_owned() });
        }
        Ok(Ip(addr))
    }

    fn is_multicast(self) -> bool {
        self.0.is_multicast()
    }

    fn is_link_local_unicast(self) -> bool {
        match self.0 {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        }
    }

    fn is_link_local_multicast(self) -> bool {
        match self.0 {
            IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
            IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
        }
    }

    /// Go's `IsGlobalUnicast`: private ranges count as global.
    fn is_global_unicast(self) -> bool {
        if self.0 == IpAddr::V4(Ipv4Addr::BROADCAST) {
            return false;
        }
        !self.0.is_unspecified() && !self.0.is_loopback() && !self.is_multicast() && !self.is_link_local_unicast()
    }
}

impl Cidr {
    /// `parseCIDR`: Go's `netip.ParsePrefix`, IPv4-mapped refused.
    pub fn parse(raw: &str) -> Result<Cidr, IpError> {
        let fail = |why: &str| IpError::Prefix { text: raw.to_owned(), reason: why.to_owned() };
        let (addr, bits) = raw.rsplit_once('/').ok_or_else(|| fail("no '/'"))?;
        let (addr, zone) = parse_addr(addr).map_err(|e| fail(&e))?;
        if zone {
            return Err(fail("IPv6 zones cannot be present in a prefix"));
        }
        let bad_bits = || fail(&format!("bad bits after slash: {bits:?}"));
        if bits.len() > 1 && !(b'1'..=b'9').contains(&bits.as_bytes()[0]) {
            return Err(bad_bits());
        }
        let bits: i64 = bits.parse().map_err(|_| bad_bits())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if !(0..=max).contains(&bits) {
            return Err(fail("prefix length out of range"));
        }
        let bits = bits as u8;
        if let IpAddr::V6(v6) = addr
            && v6.to_ipv4_mapped().is_some()
        {
            return Err(IpError::Ipv4Mapped { text: raw.to_owned() });
        }
        Ok(Cidr { addr, bits })
    }

    fn masked(self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = if self.bits == 0 { 0 } else { u32::MAX << (32 - u32::from(self.bits)) };
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = if self.bits == 0 { 0 } else { u128::MAX << (128 - u32::from(self.bits)) };
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        };
        Cidr { addr, bits: self.bits }
    }

    /// Go's `Prefix.Contains`.
    fn contains(self, ip: Ip) -> bool {
        if self.addr.is_ipv4() != ip.0.is_ipv4() {
            return false;
        }
        Cidr { addr: ip.0, bits: self.bits }.masked().addr == self.masked().addr
    }

    /// `containsCIDR`: `Overlaps` and no shorter than this prefix.
    fn contains_cidr(self, other: Cidr) -> bool {
        if self.addr.is_ipv4() != other.addr.is_ipv4() || self.bits > other.bits {
            return false;
        }
        let bits = self.bits.min(other.bits);
        Cidr { addr: self.addr, bits }.masked().addr == Cidr { addr: other.addr, bits }.masked().addr
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

macro_rules! value_type {
    ($ty:ty, $cel:expr) => {
        impl Val for $ty {
            fn get_type(&self) -> &Type {
                &$cel
            }

            fn cel_type() -> &'static Type {
                &$cel
            }

            fn equals(&self, other: &dyn Val) -> bool {
                other.downcast_ref::<$ty>().is_some_and(|o| o == self)
            }

            fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
                Box::new(*self)
            }

            fn as_any(&self) -> Option<&dyn Any> {
                Some(self)
            }
        }

        impl StaticVal for $ty {}
    };
}

value_type!(Ip, IP_TYPE);
value_type!(Cidr, CIDR_TYPE);

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn text_at<'a>(function: &str, args: &'a [CowVal<'_, '_>], i: usize) -> Result<&'a str, ExecutionError> {
    let text = args
        .get(i)
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| error(function, "expects a string"))?;
    charge(bytes_units(text.len()))?;
    Ok(text)
}

fn ip_at(function: &str, args: &[CowVal<'_, '_>], i: usize) -> Result<Ip, ExecutionError> {
    args.get(i).and_then(|v| v.downcast_ref::<Ip>()).copied().ok_or_else(|| error(function, "expects an IP"))
}

fn cidr_at(function: &str, args: &[CowVal<'_, '_>], i: usize) -> Result<Cidr, ExecutionError> {
    args.get(i).and_then(|v| v.downcast_ref::<Cidr>()).copied().ok_or_else(|| error(function, "expects a CIDR"))
}

fn owned<'b, 'v, T: Val + 'static>(value: T) -> Out<'b, 'v> {
    Ok(CowVal::Owned(Box::new(value)))
}

fn ip_fn<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(Ip::parse(text_at("ip", &args, 0)?).map_err(|e| error("ip", e))?)
}

fn is_ip<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelBool::from(Ip::parse(text_at("isIP", &args, 0)?).is_ok()))
}

fn is_canonical<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let text = text_at("ip.isCanonical", &args, 0)?;
    let ip = Ip::parse(text).map_err(|e| error("ip.isCanonical", e))?;
    owned(CelBool::from(ip.0.to_string() == text))
}

fn ip_string<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelString::from(ip_at("string", &args, 0)?.0.to_string()))
}

fn family<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelInt::from(if ip_at("family", &args, 0)?.0.is_ipv4() { 4 } else { 6 }))
}

fn ip_predicate<'b, 'v>(function: &'static str, args: Args<'b, 'v>, test: fn(Ip) -> bool) -> Out<'b, 'v> {
    owned(CelBool::from(test(ip_at(function, &args, 0)?)))
}

fn cidr_fn<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(Cidr::parse(text_at("cidr", &args, 0)?).map_err(|e| error("cidr", e))?)
}

fn is_cidr<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelBool::from(Cidr::parse(text_at("isCIDR", &args, 0)?).is_ok()))
}

fn cidr_string<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelString::from(cidr_at("string", &args, 0)?.to_string()))
}

fn contains_ip<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let cidr = cidr_at("containsIP", &args, 0)?;
    let ip = match args.get(1).and_then(|v| v.downcast_ref::<CelString>()) {
        Some(text) => Ip::parse(text.inner()).map_err(|e| error("containsIP", e))?,
        None => ip_at("containsIP", &args, 1)?,
    };
    owned(CelBool::from(cidr.contains(ip)))
}

fn contains_cidr<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let cidr = cidr_at("containsCIDR", &args, 0)?;
    let other = match args.get(1).and_then(|v| v.downcast_ref::<CelString>()) {
        Some(text) => Cidr::parse(text.inner()).map_err(|e| error("containsCIDR", e))?,
        None => cidr_at("containsCIDR", &args, 1)?,
    };
    owned(CelBool::from(cidr.contains_cidr(other)))
}

fn cidr_ip<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(Ip(cidr_at("ip", &args, 0)?.addr))
}

fn prefix_length<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(CelInt::from(i64::from(cidr_at("prefixLength", &args, 0)?.bits)))
}

fn masked<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    owned(cidr_at("masked", &args, 0)?.masked())
}

/// Registers the IP and CIDR types and functions on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let ip = || IP_TYPE.to_owned();
    let cidr = || CIDR_TYPE.to_owned();
    env.add_type(ip())?;
    env.add_type(cidr())?;
    env.add_overload("ip", "string_to_ip", vec![STRING_TYPE], ip_fn)?;
    env.add_overload("isIP", "is_ip", vec![STRING_TYPE], is_ip)?;
    env.add_overload("ip.isCanonical", "ip_is_canonical", vec![STRING_TYPE], is_canonical)?;
    env.add_overload("string", "ip_to_string", vec![ip()], ip_string)?;
    env.add_member_overload("family", "ip_family", ip(), vec![], family)?;
    env.add_member_overload("isUnspecified", "ip_is_unspecified", ip(), vec![], |a| {
        ip_predicate("isUnspecified", a, |ip| ip.0.is_unspecified())
    })?;
    env.add_member_overload("isLoopback", "ip_is_loopback", ip(), vec![], |a| {
        ip_predicate("isLoopback", a, |ip| ip.0.is_loopback())
    })?;
    env.add_member_overload("isLinkLocalMulticast", "ip_is_link_local_multicast", ip(), vec![], |a| {
        ip_predicate("isLinkLocalMulticast", a, Ip::is_link_local_multicast)
    })?;
    env.add_member_overload("isLinkLocalUnicast", "ip_is_link_local_unicast", ip(), vec![], |a| {
        ip_predicate("isLinkLocalUnicast", a, Ip::is_link_local_unicast)
    })?;
    env.add_member_overload("isGlobalUnicast", "ip_is_global_unicast", ip(), vec![], |a| {
        ip_predicate("isGlobalUnicast", a, Ip::is_global_unicast)
    })?;
    env.add_overload("cidr", "string_to_cidr", vec![STRING_TYPE], cidr_fn)?;
    env.add_overload("isCIDR", "is_cidr", vec![STRING_TYPE], is_cidr)?;
    env.add_overload("string", "cidr_to_string", vec![cidr()], cidr_string)?;
    env.add_member_overload("containsIP", "cidr_contains_ip_string", cidr(), vec![STRING_TYPE], contains_ip)?;
    env.add_member_overload("containsIP", "cidr_contains_ip_ip", cidr(), vec![ip()], contains_ip)?;
    env.add_member_overload("containsCIDR", "cidr_contains_cidr_string", cidr(), vec![STRING_TYPE], contains_cidr)?;
    env.add_member_overload("containsCIDR", "cidr_contains_cidr", cidr(), vec![cidr()], contains_cidr)?;
    env.add_member_overload("ip", "cidr_ip", cidr(), vec![], cidr_ip)?;
    env.add_member_overload("prefixLength", "cidr_prefix_length", cidr(), vec![], prefix_length)?;
    env.add_member_overload("masked", "cidr_masked", cidr(), vec![], masked)?;
    Ok(())
}
