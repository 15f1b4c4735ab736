//! Static CEL cost estimation for `x-kubernetes-validations`, after cel-go's `checker/cost.go` with the
//! apiserver's schema-derived size estimates (`SchemaDeclType`, `estimateMaxArrayItemsFromMinSize`...).
//!
//! Owns: the declared-size view of a schema ([`Decl`]), the per-expression cost ranges, and the
//! cardinality helper the apiserver multiplies rule costs by. Must not decide limits or report errors
//! (see `crd`). This is a port of the cost model for the expressions CRD rules commonly use, not of
//! the whole type checker: unknown function results are treated as unknown size, like cel-go does.

use std::collections::{BTreeMap, HashMap};

use kube::core::cel::cel::common::ast::{EntryExpr, Expr, LiteralValue};
use kube::core::cel::cel::parser::Expression;

use super::cel::escape;
use super::node::Node;

/// `celconfig.MaxRequestSizeBytes`.
pub(crate) const MAX_REQUEST_SIZE_BYTES: i64 = 3 * 1024 * 1024;
const STRING_TRAVERSAL_COST_FACTOR: f64 = 0.1;
const REGEX_STRING_LENGTH_COST_FACTOR: f64 = 0.25;

/// The kind of a declared type.
#[derive(Debug)]
pub(crate) enum DeclKind {
    Object(BTreeMap<String, Decl>),
    List(Box<Decl>),
    Map(Box<Decl>),
    String,
    Bytes,
    Int,
    Double,
    Bool,
    Timestamp,
    Duration,
    Dyn,
}

/// The apiserver's `DeclType`: a kind, the maximum number of elements (items, entries, bytes) and the
/// minimum JSON size of a value.
#[derive(Debug)]
pub(crate) struct Decl {
    pub kind: DeclKind,
    pub max_elements: i64,
    pub min_size: i64,
}

/// The shared `StringType` used for map keys: no declared maximum.
static KEY_DECL: Decl = Decl { kind: DeclKind::String, max_elements: 0, min_size: 2 };

fn scalar(kind: DeclKind, min_size: i64, max: i64) -> Decl {
    Decl { kind, max_elements: max, min_size }
}

/// `SchemaDeclType(node, isResourceRoot)`; `None` where CEL has no type for the schema.
pub(crate) fn decl(node: &Node, resource_root: bool) -> Option<Decl> {
    if node.int_or_string {
        // Bounded by maxLength (in code points, up to 4 bytes each) when the schema has one.
        let max = node.max_length.map(|m| m.max(0).saturating_mul(4)).unwrap_or(MAX_REQUEST_SIZE_BYTES - 2);
        return Some(scalar(DeclKind::Dyn, 1, max));
    }
    match node.ty.as_str() {
        "array" => {
            let item = node.items.as_deref()?;
            let item_decl = decl(item, item.embedded)?;
            let max = match node.max_items {
                Some(m) => m.max(0),
                None => (MAX_REQUEST_SIZE_BYTES - 2) / (item_decl.min_size + 1),
            };
            Some(Decl { kind: DeclKind::List(Box::new(item_decl)), max_elements: max, min_size: 2 })
        }
        "object" => {
            if let Some(add) = node.additional_schema() {
                let value = decl(add, add.embedded)?;
                let max = match node.max_properties {
                    Some(m) => m.max(0),
                    None => (MAX_REQUEST_SIZE_BYTES - 2) / (value.min_size + 6),
                };
                return Some(Decl { kind: DeclKind::Map(Box::new(value)), max_elements: max, min_size: 2 });
            }
            let mut fields = BTreeMap::new();
            let mut min_size = 2;
            for (name, prop) in &node.properties {
                let Some(d) = decl(prop, prop.embedded) else { continue };
                if node.required.contains(name) && prop.default.is_none() {
                    min_size += name.len() as i64 + d.min_size + 4;
                }
                if let Some(escaped) = escape(name) {
                    fields.insert(escaped, d);
                }
            }
            if resource_root || node.embedded {
                // apiVersion, kind, metadata.name and metadata.generateName are always visible to rules.
                let unbounded = MAX_REQUEST_SIZE_BYTES - 2;
                fields.entry("apiVersion".into()).or_insert_with(|| scalar(DeclKind::String, 2, unbounded));
                fields.entry("kind".into()).or_insert_with(|| scalar(DeclKind::String, 2, unbounded));
                let mut meta = BTreeMap::new();
                meta.insert("name".to_string(), scalar(DeclKind::String, 2, unbounded));
                meta.insert("generateName".to_string(), scalar(DeclKind::String, 2, unbounded));
                fields.insert("metadata".into(), Decl { kind: DeclKind::Object(meta), max_elements: 0, min_size: 2 });
            }
            Some(Decl { kind: DeclKind::Object(fields), max_elements: 0, min_size })
        }
        "string" => {
            let unbounded = MAX_REQUEST_SIZE_BYTES - 2;
            Some(match node.raw_format.as_str() {
                "byte" => scalar(DeclKind::Bytes, 2, node.max_length.map(|m| m.max(0)).unwrap_or(unbounded)),
                "duration" => scalar(DeclKind::Duration, 4, 32),
                "date" => scalar(DeclKind::Timestamp, 12, 12),
                "date-time" => scalar(DeclKind::Timestamp, 21, 64),
                _ => {
                    let max = match (node.max_length, &node.enum_values) {
                        // maxLength counts code points; a code point is up to 4 bytes.
                        (Some(m), _) => m.max(0).saturating_mul(4),
                        (None, Some(e)) if !e.is_empty() => {
                            e.iter().filter_map(|v| v.as_str()).map(|s| s.len() as i64).max().unwrap_or(0)
                        }
                        _ => unbounded,
                    };
                    scalar(DeclKind::String, 2, max)
                }
            })
        }
        "boolean" => Some(scalar(DeclKind::Bool, 4, 0)),
        "number" => Some(scalar(DeclKind::Double, 1, 0)),
        "integer" => Some(scalar(DeclKind::Int, 1, 0)),
        _ => None,
    }
}

impl Decl {
    pub(crate) fn elem(&self) -> Option<&Decl> {
        match &self.kind {
            DeclKind::List(e) | DeclKind::Map(e) => Some(e),
            _ => None,
        }
    }
}

/// `maxCardinality`: how many times a value of this minimum size can occur in a request.
pub(crate) fn max_cardinality(min_size: i64) -> u64 {
    (MAX_REQUEST_SIZE_BYTES / (min_size + 1)).max(0) as u64
}

/// A cel-go `CostEstimate`/`SizeEstimate` range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Range {
    pub min: u64,
    pub max: u64,
}

const UNKNOWN: Range = Range { min: 0, max: u64::MAX };

impl Range {
    fn fixed(n: u64) -> Range {
        Range { min: n, max: n }
    }
    fn add(self, o: Range) -> Range {
        Range { min: self.min.saturating_add(o.min), max: self.max.saturating_add(o.max) }
    }
    fn mul(self, o: Range) -> Range {
        Range { min: self.min.saturating_mul(o.min), max: self.max.saturating_mul(o.max) }
    }
    fn union(self, o: Range) -> Range {
        Range { min: self.min.min(o.min), max: self.max.max(o.max) }
    }
    fn factor(self, f: f64) -> Range {
        let m = |x: u64| -> u64 {
            let v = (x as f64 * f).ceil();
            if v >= u64::MAX as f64 { u64::MAX } else { v as u64 }
        };
        Range { min: m(self.min), max: m(self.max) }
    }
}

/// The coarse static type of an expression, enough to pick cel-go's overload costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    String,
    Bytes,
    List,
    Map,
    Object,
    Scalar,
    Dyn,
}

#[derive(Clone, Copy)]
struct Est<'d> {
    cost: Range,
    size: Option<Range>,
    decl: Option<&'d Decl>,
    ty: Ty,
}

fn ty_of(d: &Decl) -> Ty {
    match d.kind {
        DeclKind::Object(_) => Ty::Object,
        DeclKind::List(_) => Ty::List,
        DeclKind::Map(_) => Ty::Map,
        DeclKind::String => Ty::String,
        DeclKind::Bytes => Ty::Bytes,
        DeclKind::Dyn => Ty::Dyn,
        _ => Ty::Scalar,
    }
}

fn from_decl(d: &Decl, cost: Range) -> Est<'_> {
    let ty = ty_of(d);
    let size = match ty {
        Ty::String | Ty::Bytes | Ty::List | Ty::Map | Ty::Object | Ty::Dyn => {
            Some(Range { min: 0, max: d.max_elements.max(0) as u64 })
        }
        Ty::Scalar => Some(Range::fixed(1)),
    };
    Est { cost, size, decl: Some(d), ty }
}

/// Estimates the cost range of `expr` with `self` (and `oldSelf`) of type `root`.
pub(crate) fn estimate(expr: &Expression, root: &Decl) -> Range {
    let mut c = Coster { root, scopes: HashMap::new(), undefined: None };
    c.cost(expr).cost
}

/// The first type error cel-go's checker would find that the coarse typing here can see: a field the
/// object type does not declare (`undefined field 'b'`), or a string function on a declared
/// non-string (`found no matching overload for 'startsWith'`). The apiserver refuses such a CRD.
pub(crate) fn undefined_field(expr: &Expression, root: &Decl) -> Option<String> {
    let mut c = Coster { root, scopes: HashMap::new(), undefined: None };
    c.cost(expr);
    c.undefined
}

/// Whether `expr` certainly yields something other than a bool (cel-go's checker refuses such a rule
/// with "cel expression must evaluate to a bool"). Only what the coarse typing here can tell: literals,
/// arithmetic, conversions, strings, lists, maps, objects and non-boolean schema fields.
pub(crate) fn not_bool(expr: &Expression, root: &Decl) -> bool {
    match &expr.expr {
        Expr::Literal(l) => !matches!(l, LiteralValue::Boolean(_)),
        Expr::Call(call)
            if matches!(
                call.func_name.as_str(),
                "_+_"
                    | "_-_"
                    | "_*_"
                    | "_/_"
                    | "_%_"
                    | "-_"
                    | "size"
                    | "int"
                    | "uint"
                    | "double"
                    | "string"
                    | "bytes"
                    | "duration"
                    | "timestamp"
            ) =>
        {
            true
        }
        _ => {
            let mut c = Coster { root, scopes: HashMap::new(), undefined: None };
            let est = c.cost(expr);
            match est.ty {
                Ty::String | Ty::Bytes | Ty::List | Ty::Map | Ty::Object => true,
                Ty::Scalar => est.decl.is_some_and(|d| !matches!(d.kind, DeclKind::Bool | DeclKind::Dyn)),
                Ty::Dyn => false,
            }
        }
    }
}

struct Coster<'d> {
    root: &'d Decl,
    scopes: HashMap<String, Vec<Est<'d>>>,
    undefined: Option<String>,
}

impl<'d> Coster<'d> {
    fn size(e: &Est<'d>) -> Range {
        e.size.unwrap_or(UNKNOWN)
    }

    fn cost(&mut self, e: &Expression) -> Est<'d> {
        match &e.expr {
            Expr::Literal(l) => {
                let (size, ty) = match l {
                    LiteralValue::String(s) => (Range::fixed(s.inner().chars().count() as u64), Ty::String),
                    LiteralValue::Bytes(b) => (Range::fixed(b.inner().len() as u64), Ty::Bytes),
                    _ => (Range::fixed(1), Ty::Scalar),
                };
                Est { cost: Range::fixed(0), size: Some(size), decl: None, ty }
            }
            Expr::Ident(name) => {
                if let Some(v) = self.scopes.get(name).and_then(|s| s.last()) {
                    return Est { cost: Range::fixed(1), ..*v };
                }
                if name == "self" || name == "oldSelf" {
                    return from_decl(self.root, Range::fixed(1));
                }
                Est { cost: Range::fixed(1), size: None, decl: None, ty: Ty::Dyn }
            }
            Expr::Select(sel) => {
                let operand = self.cost(&sel.operand);
                if let Some(DeclKind::Object(fields)) = operand.decl.map(|d| &d.kind)
                    && !fields.contains_key(&sel.field)
                    && self.undefined.is_none()
                {
                    self.undefined = Some(format!("undefined field '{}'", sel.field));
                }
                if sel.test {
                    return Est {
                        cost: operand.cost.add(Range::fixed(1)),
                        size: Some(Range::fixed(1)),
                        decl: None,
                        ty: Ty::Scalar,
                    };
                }
                let mut cost = operand.cost;
                if matches!(operand.ty, Ty::Map | Ty::Object | Ty::Dyn) {
                    cost = cost.add(Range::fixed(1));
                }
                match operand.decl.and_then(|d| match &d.kind {
                    DeclKind::Object(f) => f.get(&sel.field),
                    _ => None,
                }) {
                    Some(d) => from_decl(d, cost),
                    None => {
                        let elem =
                            operand.decl.and_then(|d| matches!(d.kind, DeclKind::Map(_)).then(|| d.elem()).flatten());
                        Est { cost, size: None, decl: elem, ty: elem.map(ty_of).unwrap_or(Ty::Dyn) }
                    }
                }
            }
            Expr::List(l) => {
                let mut cost = Range::fixed(10);
                for x in &l.elements {
                    cost = cost.add(self.cost(x).cost);
                }
                Est { cost, size: Some(Range::fixed(l.elements.len() as u64)), decl: None, ty: Ty::List }
            }
            Expr::Map(m) => {
                let mut cost = Range::fixed(30);
                for en in &m.entries {
                    match &en.expr {
                        EntryExpr::MapEntry(me) => {
                            cost = cost.add(self.cost(&me.key).cost).add(self.cost(&me.value).cost);
                        }
                        EntryExpr::StructField(f) => cost = cost.add(self.cost(&f.value).cost),
                    }
                }
                Est { cost, size: Some(Range::fixed(m.entries.len() as u64)), decl: None, ty: Ty::Map }
            }
            Expr::Struct(s) => {
                let mut cost = Range::fixed(40);
                for en in &s.entries {
                    if let EntryExpr::StructField(f) = &en.expr {
                        cost = cost.add(self.cost(&f.value).cost);
                    }
                }
                Est { cost, size: None, decl: None, ty: Ty::Object }
            }
            Expr::Comprehension(comp) => {
                let range = self.cost(&comp.iter_range);
                let init = self.cost(&comp.accu_init);
                let mut sum = range.cost.add(init.cost);
                self.scopes.entry(comp.accu_var.clone()).or_default().push(init);
                let (key, val) = self.iter_vars(&range);
                match &comp.iter_var2 {
                    Some(v2) => {
                        self.scopes.entry(comp.iter_var.clone()).or_default().push(key);
                        self.scopes.entry(v2.clone()).or_default().push(val);
                    }
                    None => {
                        let single = if range.ty == Ty::Map { key } else { val };
                        self.scopes.entry(comp.iter_var.clone()).or_default().push(single);
                    }
                }
                let loop_cost = self.cost(&comp.loop_cond).cost;
                let step_cost = self.cost(&comp.loop_step).cost;
                self.pop(&comp.iter_var);
                if let Some(v2) = &comp.iter_var2 {
                    self.pop(v2);
                }
                sum = sum.add(self.cost(&comp.result).cost);
                self.pop(&comp.accu_var);
                let count = Self::size(&range);
                sum = sum.add(count.mul(step_cost.add(loop_cost)));
                let (size, ty) = match &comp.accu_init.expr {
                    Expr::List(_) => (Some(count), Ty::List),
                    Expr::Map(_) => (Some(count), Ty::Map),
                    _ => (Some(Range::fixed(1)), Ty::Scalar),
                };
                Est { cost: sum, size, decl: None, ty }
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args),
            Expr::Unspecified => Est { cost: Range::fixed(0), size: None, decl: None, ty: Ty::Dyn },
        }
    }

    fn pop(&mut self, name: &str) {
        if let Some(s) = self.scopes.get_mut(name) {
            s.pop();
        }
    }

    /// The key and value of an iteration over `range` (`@keys`/`@indices`, `@items`/`@values`).
    fn iter_vars(&self, range: &Est<'d>) -> (Est<'d>, Est<'d>) {
        let zero = Range::fixed(0);
        let key = match range.ty {
            Ty::Map => from_decl(&KEY_DECL, zero),
            _ => Est { cost: zero, size: Some(Range::fixed(1)), decl: None, ty: Ty::Scalar },
        };
        let val = match range.decl.and_then(Decl::elem) {
            Some(d) => from_decl(d, zero),
            None => Est { cost: zero, size: None, decl: None, ty: Ty::Dyn },
        };
        (key, val)
    }

    fn call(&mut self, name: &str, target: Option<&Expression>, args: &[Expression]) -> Est<'d> {
        let args_est: Vec<Est<'d>> = args.iter().map(|a| self.cost(a)).collect();
        // String-only member functions on a value the schema declares as something else: cel-go's
        // checker finds no overload.
        const STRING_ONLY: &[&str] = &[
            "startsWith",
            "endsWith",
            "matches",
            "lowerAscii",
            "upperAscii",
            "trim",
            "split",
            "replace",
            "substring",
            "charAt",
            "find",
            "findAll",
            "contains",
        ];
        if STRING_ONLY.contains(&name)
            && let Some(t) = target
            && self.undefined.is_none()
        {
            let t = self.cost(t);
            if let Some(d) = t.decl
                && !matches!(d.kind, DeclKind::String | DeclKind::Dyn)
            {
                self.undefined = Some(format!("found no matching overload for '{name}'"));
            }
        }
        let arg_sum = args_est.iter().fold(Range::fixed(0), |acc, a| acc.add(a.cost));
        if name == "dyn"
            && let Some(a) = args_est.first()
        {
            return Est { cost: Range::fixed(1).add(a.cost), ..*a };
        }
        let target_est = target.map(|t| self.cost(t));
        let base = target_est.map(|t| t.cost).unwrap_or(Range::fixed(0));
        let scalar = |cost: Range| Est { cost, size: Some(Range::fixed(1)), decl: None, ty: Ty::Scalar };
        let a = |i: usize| args_est.get(i).copied();
        let est = match name {
            "_&&_" | "_||_" => {
                let (l, r) =
                    (a(0).map(|x| x.cost).unwrap_or(Range::fixed(0)), a(1).map(|x| x.cost).unwrap_or(Range::fixed(0)));
                scalar(Range { min: l.min, max: l.add(r).max })
            }
            "_?_:_" => {
                let (c, t, f) = match (a(0), a(1), a(2)) {
                    (Some(c), Some(t), Some(f)) => (c, t, f),
                    _ => return scalar(arg_sum),
                };
                let size = Self::size(&t).union(Self::size(&f));
                Est { cost: c.cost.add(t.cost.union(f.cost)), size: Some(size), decl: t.decl.or(f.decl), ty: t.ty }
            }
            "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
                let (l, r) = match (a(0), a(1)) {
                    (Some(l), Some(r)) => (l, r),
                    _ => return scalar(Range::fixed(1).add(arg_sum)),
                };
                let sized = |t: Ty| matches!(t, Ty::String | Ty::Bytes | Ty::List | Ty::Map | Ty::Object | Ty::Dyn);
                let equality = name == "_==_" || name == "_!=_";
                if (equality && (sized(l.ty) || sized(r.ty))) || (!equality && matches!(l.ty, Ty::String | Ty::Bytes)) {
                    let smallest = Self::size(&l).max.min(Self::size(&r).max);
                    let min = u64::from(smallest > 0);
                    scalar(Range { min, max: smallest }.factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum))
                } else {
                    scalar(Range::fixed(1).add(arg_sum))
                }
            }
            "_+_" => match (a(0), a(1)) {
                (Some(l), Some(r)) if matches!(l.ty, Ty::String | Ty::Bytes) => {
                    let size = Self::size(&l).add(Self::size(&r));
                    Est {
                        cost: size.factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                        size: Some(size),
                        decl: None,
                        ty: l.ty,
                    }
                }
                (Some(l), Some(r)) if l.ty == Ty::List => {
                    let size = Self::size(&l).add(Self::size(&r));
                    let decl = l.decl.or(r.decl);
                    Est { cost: Range::fixed(1).add(arg_sum), size: Some(size), decl, ty: Ty::List }
                }
                _ => scalar(Range::fixed(1).add(arg_sum)),
            },
            "@in" => match a(1) {
                Some(r) if r.ty == Ty::List => scalar(Self::size(&r).add(arg_sum)),
                _ => scalar(Range::fixed(1).add(arg_sum)),
            },
            "_[_]" | "_[?_]" => {
                let elem = a(0).and_then(|c| c.decl).and_then(Decl::elem);
                match elem {
                    Some(d) => from_decl(d, Range::fixed(1).add(arg_sum)),
                    None => Est { cost: Range::fixed(1).add(arg_sum), size: None, decl: None, ty: Ty::Dyn },
                }
            }
            "contains" if target_est.is_some_and(|t| t.ty == Ty::String) => {
                let t = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN).factor(STRING_TRAVERSAL_COST_FACTOR);
                let s = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN).factor(STRING_TRAVERSAL_COST_FACTOR);
                scalar(t.mul(s).add(arg_sum))
            }
            "startsWith" | "endsWith" if target.is_some() => scalar(
                a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN).factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
            ),
            // Kubernetes' library estimator (apiserver/pkg/cel/library), consulted before cel-go's own.
            "lowerAscii" | "upperAscii" | "trim" | "substring" if target_est.is_some() => {
                let size = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN);
                Est {
                    cost: size.factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                    size: Some(size),
                    decl: None,
                    ty: Ty::String,
                }
            }
            // Parsers of a string argument: one traversal (as kube-apiserver 1.36 estimates them).
            "url" | "quantity" | "isQuantity" | "ip" | "isIP" | "cidr" | "isCIDR" | "semver" | "isSemver"
                if target.is_none() && args.len() == 1 =>
            {
                let size = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN);
                scalar(size.factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum))
            }
            "replace" if target_est.is_some() && args.len() >= 2 => {
                let size = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN);
                let from = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN);
                let with = a(1).map(|x| Self::size(&x)).unwrap_or(UNKNOWN);
                // The longest result: the smallest pieces replaced by the largest replacement.
                let max = if from.min == 0 {
                    size.max.saturating_add(1).saturating_mul(with.max).saturating_add(size.max)
                } else if with.max <= from.min {
                    size.max
                } else {
                    size.max.div_ceil(from.min).saturating_mul(with.max)
                };
                Est {
                    cost: size.factor(2.0 * STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                    size: Some(Range { min: 0, max }),
                    decl: None,
                    ty: Ty::String,
                }
            }
            "split" if target_est.is_some() => {
                let size = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN);
                let max = match args.get(1).map(|x| &x.expr) {
                    Some(Expr::Literal(LiteralValue::Int(n))) => u64::try_from(n.inner().to_owned()).unwrap_or(0),
                    _ => size.max,
                };
                Est {
                    cost: size.factor(2.0 * STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                    size: Some(Range { min: 0, max }),
                    decl: None,
                    ty: Ty::List,
                }
            }
            "join" if target_est.is_some() => {
                let list = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN);
                // The elements' size is known only for a list read from the schema.
                let elem = target_est
                    .and_then(|t| t.decl)
                    .and_then(Decl::elem)
                    .map(|d| Range { min: 0, max: d.max_elements.max(0) as u64 })
                    .unwrap_or(UNKNOWN);
                let mut size = list.mul(elem);
                if let Some(sep) = a(0).map(|x| Self::size(&x)) {
                    let seps = Range { min: list.min.saturating_sub(1), max: list.max.saturating_sub(1) };
                    size = size.add(sep.mul(seps));
                }
                Est {
                    cost: size.factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                    size: Some(size),
                    decl: None,
                    ty: Ty::String,
                }
            }
            "find" | "findAll" if target_est.is_some() => {
                let size = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN);
                let t = size.add(Range::fixed(1)).factor(STRING_TRAVERSAL_COST_FACTOR);
                let regex = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN).factor(REGEX_STRING_LENGTH_COST_FACTOR);
                let ty = if name == "find" { Ty::String } else { Ty::List };
                Est { cost: t.mul(regex).add(arg_sum), size: Some(Range { min: 0, max: size.max }), decl: None, ty }
            }
            "matches" if target_est.is_some() => {
                let t = target_est.map(|t| Self::size(&t)).unwrap_or(UNKNOWN).add(Range::fixed(1));
                let regex = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN).factor(REGEX_STRING_LENGTH_COST_FACTOR);
                scalar(t.factor(STRING_TRAVERSAL_COST_FACTOR).mul(regex).add(arg_sum))
            }
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" if target_est.is_some() => {
                let t = target_est.unwrap_or(Est { cost: Range::fixed(0), size: None, decl: None, ty: Ty::Dyn });
                let size = Self::size(&t);
                let est = if t.ty == Ty::List {
                    // One comparison per element, plus a traversal of string elements.
                    let elem = t.decl.and_then(Decl::elem);
                    let per = match elem {
                        Some(d) if matches!(d.kind, DeclKind::String | DeclKind::Bytes) => Range::fixed(1).add(
                            Range { min: 0, max: d.max_elements.max(0) as u64 }.factor(STRING_TRAVERSAL_COST_FACTOR),
                        ),
                        Some(_) => Range::fixed(1),
                        // A list built by the rule: cel-go does not know its elements' type here.
                        None => Range::fixed(1),
                    };
                    size.mul(per)
                } else {
                    size.factor(STRING_TRAVERSAL_COST_FACTOR)
                };
                scalar(est.add(arg_sum))
            }
            "sets.contains" | "sets.equivalent" | "sets.intersects" => {
                let l = a(0).map(|x| Self::size(&x)).unwrap_or(UNKNOWN);
                let r = a(1).map(|x| Self::size(&x)).unwrap_or(UNKNOWN);
                scalar(l.mul(r).add(arg_sum))
            }
            // cel-go's conversions: `string(bytes)` and `bytes(string)` traverse their argument; on a
            // dyn argument (an int-or-string) every overload is possible and the estimate covers them all.
            "string" | "bytes" if args.len() == 1 => {
                let arg = a(0).unwrap_or(Est { cost: Range::fixed(0), size: None, decl: None, ty: Ty::Dyn });
                let size = Self::size(&arg);
                let traversal = size.factor(STRING_TRAVERSAL_COST_FACTOR);
                let (ty, converting) = match name {
                    "string" => (Ty::String, arg.ty == Ty::Bytes),
                    _ => (Ty::Bytes, arg.ty == Ty::String),
                };
                let result = |s: Range| match name {
                    "string" => Range { min: s.min / 4, max: s.max },
                    _ => Range { min: s.min, max: s.max.saturating_mul(4) },
                };
                let (cost, size) = if converting {
                    (traversal, Some(result(size)))
                } else if arg.ty == Ty::Dyn {
                    (traversal.union(Range::fixed(1)), Some(result(size)))
                } else {
                    (Range::fixed(1), None)
                };
                Est { cost: cost.add(arg_sum), size, decl: None, ty }
            }
            "size" | "int" | "uint" | "double" | "timestamp" | "duration" => scalar(Range::fixed(1).add(arg_sum)),
            _ => scalar(Range::fixed(1).add(arg_sum)),
        };
        Est { cost: base.add(est.cost), ..est }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::core::cel::cel::Program;
    use serde_json::json;

    fn cost_of(rule: &str, schema: serde_json::Value) -> u64 {
        let node = Node::parse(&schema);
        let d = decl(&node, false).unwrap();
        let p = Program::compile(rule).unwrap();
        estimate(p.expression(), &d).max
    }

    #[test]
    fn unbounded_lists_make_comprehensions_expensive() {
        let unbounded = json!({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "string"}}}});
        let bounded = json!({"type": "object", "properties": {"l": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 10}}}});
        let rule = "self.l.all(x, x.startsWith('a'))";
        assert!(cost_of(rule, unbounded) > 1_000_000);
        assert!(cost_of(rule, bounded) < 100);
    }

    #[test]
    fn scalar_rules_are_cheap() {
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}});
        assert!(cost_of("self.a <= self.b", s) < 10);
    }
}
