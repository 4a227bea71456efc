//! CEL types and their unification, as cel-go's checker computes them
//! (`checker/types.go`): type parameters are bound by a [`Mapping`], `dyn`
//! and `any` are assignable both ways, and `null` to the nullable kinds.

use std::fmt;

/// An object type of the selector environment, named as Kubernetes names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectType {
    Device,
    Quantity,
    Semver,
    Url,
    Ip,
    Cidr,
    NamedFormat,
}

impl ObjectType {
    pub fn name(self) -> &'static str {
        match self {
            ObjectType::Device => "kubernetes.DRADevice",
            ObjectType::Quantity => "kubernetes.Quantity",
            ObjectType::Semver => "kubernetes.Semver",
            ObjectType::Url => "kubernetes.URL",
            ObjectType::Ip => "net.IP",
            ObjectType::Cidr => "net.CIDR",
            ObjectType::NamedFormat => "kubernetes.NamedFormat",
        }
    }
}

/// The static type of an expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Dyn,
    /// `google.protobuf.Any`: Kubernetes declares attribute values so; the
    /// checker treats it as `dyn`, except that it cannot be iterated.
    Any,
    /// The type of an expression that failed to check; assignable anywhere
    /// so that one mistake is reported once.
    Error,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    List(Box<Type>),
    Map(Box<Type>, Box<Type>),
    /// A type value, `type(int)`; `None` is the plain `type`.
    Type(Option<Box<Type>>),
    Optional(Box<Type>),
    Object(ObjectType),
    /// A type variable: in a declaration, a parameter such as `A`; while
    /// checking, a free variable bound through the [`Mapping`].
    Param(u32),
}

impl Type {
    pub fn list(elem: Type) -> Type {
        Type::List(Box::new(elem))
    }

    pub fn map(key: Type, value: Type) -> Type {
        Type::Map(Box::new(key), Box::new(value))
    }

    /// `dyn` or `any`.
    pub fn is_dyn(&self) -> bool {
        matches!(self, Type::Dyn | Type::Any)
    }

    pub fn is_dyn_or_error(&self) -> bool {
        matches!(self, Type::Dyn | Type::Any | Type::Error)
    }

    /// Kinds to which `null` may be assigned (cel-go's legacy nullability).
    fn is_nullable(&self) -> bool {
        matches!(self, Type::Optional(_) | Type::Object(_) | Type::Any | Type::Duration | Type::Timestamp | Type::Null)
    }

    /// The same type with every type parameter replaced by `f(index)`.
    pub fn map_params(&self, f: &mut impl FnMut(u32) -> Type) -> Type {
        match self {
            Type::Param(p) => f(*p),
            Type::List(e) => Type::list(e.map_params(f)),
            Type::Map(k, v) => Type::map(k.map_params(f), v.map_params(f)),
            Type::Optional(e) => Type::Optional(Box::new(e.map_params(f))),
            Type::Type(Some(t)) => Type::Type(Some(Box::new(t.map_params(f)))),
            other => other.clone(),
        }
    }
}

impl fmt::Display for Type {
    /// As cel-go's `FormatCELType` prints it, so messages read the same.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Dyn => f.write_str("dyn"),
            Type::Any => f.write_str("any"),
            Type::Error => f.write_str("!error!"),
            Type::Null => f.write_str("null"),
            Type::Bool => f.write_str("bool"),
            Type::Int => f.write_str("int"),
            Type::Uint => f.write_str("uint"),
            Type::Double => f.write_str("double"),
            Type::String => f.write_str("string"),
            Type::Bytes => f.write_str("bytes"),
            Type::Duration => f.write_str("duration"),
            Type::Timestamp => f.write_str("timestamp"),
            Type::List(e) => write!(f, "list({e})"),
            Type::Map(k, v) => write!(f, "map({k}, {v})"),
            Type::Type(None) => f.write_str("type"),
            Type::Type(Some(t)) => write!(f, "type({t})"),
            Type::Optional(t) => write!(f, "optional_type({t})"),
            Type::Object(o) => f.write_str(o.name()),
            Type::Param(p) => write!(f, "_var{p}"),
        }
    }
}

/// Bindings of type variables, with an undo log so a failed overload trial
/// leaves no trace (cel-go copies the whole mapping per trial instead).
#[derive(Default, Debug)]
pub struct Mapping {
    bound: Vec<Option<Type>>,
    undo: Vec<(u32, Option<Type>)>,
}

impl Mapping {
    /// A variable no binding mentions yet.
    pub fn fresh(&mut self) -> Type {
        self.bound.push(None);
        Type::Param((self.bound.len() - 1) as u32)
    }

    fn find(&self, p: u32) -> Option<&Type> {
        self.bound.get(p as usize).and_then(Option::as_ref)
    }

    fn bind(&mut self, p: u32, t: Type) {
        if let Some(slot) = self.bound.get_mut(p as usize) {
            let old = slot.replace(t);
            self.undo.push((p, old));
        }
    }

    fn mark(&self) -> usize {
        self.undo.len()
    }

    fn rollback(&mut self, mark: usize) {
        while self.undo.len() > mark {
            if let Some((p, old)) = self.undo.pop()
                && let Some(slot) = self.bound.get_mut(p as usize)
            {
                *slot = old;
            }
        }
    }

    /// Whether a value of type `from` may be used where `to` is expected,
    /// binding variables on success only.
    pub fn assignable(&mut self, to: &Type, from: &Type) -> bool {
        let mark = self.mark();
        let ok = self.is_assignable(to, from);
        if !ok {
            self.rollback(mark);
        }
        ok
    }

    /// [`Mapping::assignable`] element-wise.
    pub fn assignable_all(&mut self, to: &[Type], from: &[Type]) -> bool {
        let mark = self.mark();
        let ok = to.len() == from.len() && to.iter().zip(from).all(|(t, f)| self.is_assignable(t, f));
        if !ok {
            self.rollback(mark);
        }
        ok
    }

    /// `internalIsAssignable(m, t1, t2)`.
    fn is_assignable(&mut self, t1: &Type, t2: &Type) -> bool {
        if let Type::Param(p2) = t2 {
            let (valid, has_sub) = self.valid_substitution(t1, *p2);
            if valid {
                return true;
            }
            if has_sub {
                return false;
            }
        }
        if let Type::Param(p1) = t1 {
            return self.valid_substitution(t2, *p1).0;
        }
        if t1.is_dyn_or_error() || t2.is_dyn_or_error() {
            return true;
        }
        if *t1 == Type::Null {
            return t2.is_nullable();
        }
        if *t2 == Type::Null {
            return t1.is_nullable();
        }
        match (t1, t2) {
            (Type::Type(_), other) => matches!(other, Type::Type(_)),
            (Type::List(a), Type::List(b)) | (Type::Optional(a), Type::Optional(b)) => self.is_assignable(a, b),
            (Type::Map(k1, v1), Type::Map(k2, v2)) => self.is_assignable(k1, k2) && self.is_assignable(v1, v2),
            (Type::List(_) | Type::Optional(_) | Type::Map(..), _) => false,
            (a, b) => a == b,
        }
    }

    /// `isValidTypeSubstitution(m, t1, param)`: (valid, param had a binding).
    fn valid_substitution(&mut self, t1: &Type, param: u32) -> (bool, bool) {
        if *t1 == Type::Param(param) {
            return (true, true);
        }
        if let Some(sub) = self.find(param).cloned() {
            if *t1 == sub {
                return (true, true);
            }
            if self.is_assignable(t1, &sub) {
                let general = most_general(t1, &sub).clone();
                if self.not_referenced_in(param, &general) {
                    self.bind(param, general);
                }
                return (true, true);
            }
            return (false, true);
        }
        if self.not_referenced_in(param, t1) {
            self.bind(param, t1.clone());
            return (true, false);
        }
        (false, false)
    }

    fn not_referenced_in(&self, param: u32, within: &Type) -> bool {
        match within {
            Type::Param(p) if *p == param => false,
            Type::Param(p) => self.find(*p).is_none_or(|sub| self.not_referenced_in(param, sub)),
            Type::List(e) | Type::Optional(e) => self.not_referenced_in(param, e),
            Type::Type(Some(e)) => self.not_referenced_in(param, e),
            Type::Map(k, v) => self.not_referenced_in(param, k) && self.not_referenced_in(param, v),
            _ => true,
        }
    }

    /// `t` with every bound variable replaced by its binding; unbound ones
    /// become `dyn` when `unbound_to_dyn`.
    pub fn substitute(&self, t: &Type, unbound_to_dyn: bool) -> Type {
        self.substitute_depth(t, unbound_to_dyn, 0)
    }

    fn substitute_depth(&self, t: &Type, unbound_to_dyn: bool, depth: usize) -> Type {
        // Bindings never form a cycle (`not_referenced_in`); the depth bound
        // only keeps a bug from becoming a stack overflow.
        if depth > 256 {
            return Type::Dyn;
        }
        match t {
            Type::Param(p) => match self.find(*p) {
                Some(sub) => self.substitute_depth(sub, unbound_to_dyn, depth + 1),
                None if unbound_to_dyn => Type::Dyn,
                None => t.clone(),
            },
            Type::List(e) => Type::list(self.substitute_depth(e, unbound_to_dyn, depth + 1)),
            Type::Optional(e) => Type::Optional(Box::new(self.substitute_depth(e, unbound_to_dyn, depth + 1))),
            Type::Type(Some(e)) => Type::Type(Some(Box::new(self.substitute_depth(e, unbound_to_dyn, depth + 1)))),
            Type::Map(k, v) => Type::map(
                self.substitute_depth(k, unbound_to_dyn, depth + 1),
                self.substitute_depth(v, unbound_to_dyn, depth + 1),
            ),
            other => other.clone(),
        }
    }
}

/// The less specific of two types (`mostGeneral`).
pub fn most_general<'a>(t1: &'a Type, t2: &'a Type) -> &'a Type {
    if equal_or_less_specific(t1, t2) { t1 } else { t2 }
}

fn equal_or_less_specific(t1: &Type, t2: &Type) -> bool {
    if t1.is_dyn() || matches!(t1, Type::Param(_)) {
        return true;
    }
    if t2.is_dyn() || matches!(t2, Type::Param(_)) {
        return false;
    }
    match (t1, t2) {
        (Type::List(a), Type::List(b)) | (Type::Optional(a), Type::Optional(b)) => equal_or_less_specific(a, b),
        (Type::Map(k1, v1), Type::Map(k2, v2)) => equal_or_less_specific(k1, k2) && equal_or_less_specific(v1, v2),
        (Type::Type(_), Type::Type(_)) => true,
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_binds_once_and_then_must_agree() {
        let mut m = Mapping::default();
        let a = m.fresh();
        assert!(m.assignable_all(&[a.clone(), a.clone()], &[Type::Int, Type::Int]));
        let b = m.fresh();
        assert!(!m.assignable_all(&[b.clone(), b.clone()], &[Type::Int, Type::Double]));
        // The failed trial left `b` unbound.
        assert_eq!(m.substitute(&b, false), b);
        assert_eq!(m.substitute(&a, true), Type::Int);
    }

    #[test]
    fn dyn_and_any_are_assignable_both_ways_null_only_to_nullable_kinds() {
        let mut m = Mapping::default();
        assert!(m.assignable(&Type::Int, &Type::Dyn));
        assert!(m.assignable(&Type::Any, &Type::String));
        assert!(m.assignable(&Type::Object(ObjectType::Quantity), &Type::Null));
        assert!(!m.assignable(&Type::Int, &Type::Null));
        assert!(!m.assignable(&Type::list(Type::Int), &Type::list(Type::Double)));
        assert!(m.assignable(&Type::list(Type::Int), &Type::list(Type::Dyn)));
    }

    #[test]
    fn a_list_literal_variable_takes_the_more_general_type() {
        let mut m = Mapping::default();
        let a = m.fresh();
        assert!(m.assignable(&a, &Type::Int));
        assert!(m.assignable(&a, &Type::Dyn));
        assert_eq!(m.substitute(&a, true), Type::Dyn);
    }

    #[test]
    fn types_print_as_cel_go_prints_them() {
        let t = Type::map(Type::String, Type::list(Type::Object(ObjectType::Quantity)));
        assert_eq!(t.to_string(), "map(string, list(kubernetes.Quantity))");
        assert_eq!(Type::Type(Some(Box::new(Type::Int))).to_string(), "type(int)");
    }
}
