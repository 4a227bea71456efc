//! The prepared channel claim whose `Ready` condition the preparer, the
//! health loop and the binding pass write ([`super::ready_condition`]).

/// The claim whose condition is written.
pub(crate) struct ChannelClaim<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub domain_uid: &'a str,
    pub device: &'a str,
}
