//! The JSONPath dialect of Kubernetes (client-go's `util/jsonpath`) as CRD printer columns use it:
//! `.field` with `\.` escapes (`.metadata.labels.node\.kubernetes\.io/instance-type`), `..field`
//! (recursive descent), `.*`, `[n]`, `[-n]`, `[a:b]`, `[*]`, `['key']`, unions `[0,2]`, and
//! filters `[?(@.type=="Ready")]` (`==`, `!=`, `<`, `<=`, `>`, `>=`, or existence).
//! Owns: parsing and evaluation to the list of matched values. Must not do: rendering cells.

use serde_json::Value;

/// One step of a parsed path.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Recursive(String),
    Wildcard,
    Index(Vec<Index>),
    Keys(Vec<String>),
    Filter(Filter),
}

#[derive(Clone, Debug, PartialEq)]
enum Index {
    One(i64),
    Slice(Option<i64>, Option<i64>),
}

#[derive(Clone, Debug, PartialEq)]
struct Filter {
    left: Operand,
    op: Option<(String, Operand)>,
}

#[derive(Clone, Debug, PartialEq)]
enum Operand {
    Path(Vec<Step>),
    Literal(Value),
}

/// A path that does not parse (kube-apiserver refuses such CRDs; a cell then stays empty).
#[derive(Debug, thiserror::Error)]
#[error("invalid JSONPath {path:?}: {reason}")]
pub(crate) struct ParseError {
    path: String,
    reason: String,
}

/// Characters that end a field name unless escaped with `\` (client-go's `isTerminator`).
fn is_terminator(c: char) -> bool {
    matches!(c, ' ' | '.' | ',' | '[' | ']' | '$' | '@' | '{' | '}' | '(' | ')' | '=' | '!' | '<' | '>')
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    src: &'a str,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> ParseError {
        ParseError { path: self.src.to_string(), reason: reason.into() }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars.get(self.pos..self.pos + n).is_some_and(|w| w.iter().copied().eq(s.chars())) {
            self.pos += n;
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while self.peek() == Some(' ') {
            self.pos += 1;
        }
    }

    /// A field name; a backslash makes the next character part of it.
    fn name(&mut self) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if c == '\\' {
                self.pos += 1;
                if let Some(n) = self.peek() {
                    out.push(n);
                    self.pos += 1;
                }
            } else if is_terminator(c) {
                break;
            } else {
                out.push(c);
                self.pos += 1;
            }
        }
        out
    }

    /// Steps until the end, or (inside a filter) until an operator or `)`.
    fn steps(&mut self, in_filter: bool) -> Result<Vec<Step>, ParseError> {
        let mut steps = Vec::new();
        loop {
            match self.peek() {
                None => return Ok(steps),
                Some('.') if self.eat("..") => {
                    let n = self.name();
                    if n.is_empty() {
                        return Err(self.err("a name must follow .."));
                    }
                    steps.push(Step::Recursive(n));
                }
                Some('.') => {
                    self.pos += 1;
                    if self.eat("*") {
                        steps.push(Step::Wildcard);
                    } else {
                        let n = self.name();
                        if !n.is_empty() {
                            steps.push(Step::Field(n));
                        }
                    }
                }
                Some('[') => {
                    self.pos += 1;
                    steps.push(self.bracket()?);
                }
                Some(_) if in_filter => return Ok(steps),
                Some(c) => return Err(self.err(format!("unexpected {c:?}"))),
            }
        }
    }

    fn bracket(&mut self) -> Result<Step, ParseError> {
        self.skip_spaces();
        let step = if self.eat("*") {
            Step::Wildcard
        } else if self.eat("?(") {
            let f = self.filter()?;
            if !self.eat(")") {
                return Err(self.err("unclosed filter"));
            }
            Step::Filter(f)
        } else if matches!(self.peek(), Some('\'' | '"')) {
            let mut keys = vec![self.quoted()?];
            while self.eat(",") {
                self.skip_spaces();
                keys.push(self.quoted()?);
            }
            Step::Keys(keys)
        } else {
            let mut idx = vec![self.index()?];
            while self.eat(",") {
                idx.push(self.index()?);
            }
            Step::Index(idx)
        };
        self.skip_spaces();
        if !self.eat("]") {
            return Err(self.err("unclosed ["));
        }
        Ok(step)
    }

    fn quoted(&mut self) -> Result<String, ParseError> {
        let Some(q) = self.peek() else { return Err(self.err("expected a quoted string")) };
        self.pos += 1;
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some('\\') => {
                    self.pos += 1;
                    if let Some(c) = self.peek() {
                        out.push(c);
                        self.pos += 1;
                    }
                }
                Some(c) if c == q => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn int(&mut self) -> Option<i64> {
        self.skip_spaces();
        let start = self.pos;
        if self.peek() == Some('-') {
            self.pos += 1;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        self.skip_spaces();
        s.parse().ok()
    }

    fn index(&mut self) -> Result<Index, ParseError> {
        let a = self.int();
        if self.eat(":") {
            let b = self.int();
            // A step (`[a:b:s]`) is accepted and ignored beyond 1, as columns never use it.
            if self.eat(":") {
                let _ = self.int();
            }
            return Ok(Index::Slice(a, b));
        }
        a.map(Index::One).ok_or_else(|| self.err("expected an index"))
    }

    fn operand(&mut self) -> Result<Operand, ParseError> {
        self.skip_spaces();
        if self.eat("@") {
            return Ok(Operand::Path(self.steps(true)?));
        }
        if matches!(self.peek(), Some('\'' | '"')) {
            return Ok(Operand::Literal(Value::String(self.quoted()?)));
        }
        let start = self.pos;
        while self.peek().is_some_and(|c| !matches!(c, ')' | ' ')) {
            self.pos += 1;
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        serde_json::from_str(&s).map(Operand::Literal).map_err(|_| self.err(format!("bad literal {s:?}")))
    }

    fn filter(&mut self) -> Result<Filter, ParseError> {
        let left = self.operand()?;
        self.skip_spaces();
        let op = ["==", "!=", "<=", ">=", "<", ">"].into_iter().find(|op| self.eat(op));
        let op = match op {
            Some(op) => Some((op.to_string(), self.operand()?)),
            None => None,
        };
        self.skip_spaces();
        Ok(Filter { left, op })
    }
}

/// A parsed JSONPath.
#[derive(Clone, Debug)]
pub(crate) struct JsonPath {
    steps: Vec<Step>,
}

impl JsonPath {
    /// Parses `.a.b`, `{.a.b}` or `$.a.b`.
    pub(crate) fn parse(path: &str) -> Result<JsonPath, ParseError> {
        let p = path.trim();
        let p = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(p).trim();
        let p = p.strip_prefix('$').unwrap_or(p);
        let mut parser = Parser { chars: p.chars().collect(), pos: 0, src: path };
        let steps = parser.steps(false)?;
        Ok(JsonPath { steps })
    }

    /// Every value the path selects, in document order.
    pub(crate) fn find<'v>(&self, obj: &'v Value) -> Vec<&'v Value> {
        eval(&self.steps, vec![obj])
    }
}

fn eval<'v>(steps: &[Step], mut cur: Vec<&'v Value>) -> Vec<&'v Value> {
    for step in steps {
        let mut next = Vec::new();
        for v in cur {
            apply(step, v, &mut next);
        }
        cur = next;
    }
    cur
}

fn apply<'v>(step: &Step, v: &'v Value, out: &mut Vec<&'v Value>) {
    match step {
        Step::Field(k) => {
            if let Some(x) = v.get(k.as_str()) {
                out.push(x);
            }
        }
        Step::Keys(ks) => out.extend(ks.iter().filter_map(|k| v.get(k.as_str()))),
        Step::Wildcard => match v {
            Value::Array(a) => out.extend(a.iter()),
            Value::Object(m) => out.extend(m.values()),
            _ => {}
        },
        Step::Recursive(k) => recurse(k, v, out),
        Step::Index(idx) => {
            let Value::Array(a) = v else { return };
            let len = a.len() as i64;
            let norm = |i: i64| if i < 0 { i + len } else { i };
            for i in idx {
                match *i {
                    Index::One(n) => {
                        if let Some(x) = usize::try_from(norm(n)).ok().and_then(|n| a.get(n)) {
                            out.push(x);
                        }
                    }
                    Index::Slice(s, e) => {
                        let s = norm(s.unwrap_or(0)).clamp(0, len);
                        let e = norm(e.unwrap_or(len)).clamp(0, len);
                        for n in s..e {
                            if let Some(x) = usize::try_from(n).ok().and_then(|n| a.get(n)) {
                                out.push(x);
                            }
                        }
                    }
                }
            }
        }
        Step::Filter(f) => {
            let items: Vec<&Value> = match v {
                Value::Array(a) => a.iter().collect(),
                _ => Vec::new(),
            };
            out.extend(items.into_iter().filter(|item| matches(f, item)));
        }
    }
}

fn recurse<'v>(k: &str, v: &'v Value, out: &mut Vec<&'v Value>) {
    match v {
        Value::Object(m) => {
            if let Some(x) = m.get(k) {
                out.push(x);
            }
            for x in m.values() {
                recurse(k, x, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                recurse(k, x, out);
            }
        }
        _ => {}
    }
}

fn operand<'v>(o: &'v Operand, item: &'v Value) -> Option<&'v Value> {
    match o {
        Operand::Literal(v) => Some(v),
        Operand::Path(steps) => eval(steps, vec![item]).into_iter().next(),
    }
}

fn matches(f: &Filter, item: &Value) -> bool {
    let Some(left) = operand(&f.left, item) else { return false };
    let Some((op, right)) = &f.op else { return true };
    let Some(right) = operand(right, item) else { return false };
    let ord = match (left, right) {
        (Value::Number(a), Value::Number(b)) => a.as_f64().partial_cmp(&b.as_f64()),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        _ => None,
    };
    match op.as_str() {
        "==" => left == right || ord == Some(std::cmp::Ordering::Equal),
        "!=" => !(left == right || ord == Some(std::cmp::Ordering::Equal)),
        "<" => ord == Some(std::cmp::Ordering::Less),
        "<=" => matches!(ord, Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)),
        ">" => ord == Some(std::cmp::Ordering::Greater),
        ">=" => matches!(ord, Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)),
        _ => false,
    }
}

/// A value as Go's `fmt.Print` shows the decoded JSON (what a `string` printer column prints for
/// a non-string value): numbers as written, `map[k:v …]` with sorted keys, `[a b]`.
pub(crate) fn go_text(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_text).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut kv: Vec<(&String, &Value)> = m.iter().collect();
            kv.sort_by(|a, b| a.0.cmp(b.0));
            format!("map[{}]", kv.iter().map(|(k, v)| format!("{k}:{}", go_text(v))).collect::<Vec<_>>().join(" "))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn first(obj: &Value, p: &str) -> Option<Value> {
        JsonPath::parse(p).unwrap().find(obj).first().map(|v| (*v).clone())
    }

    #[test]
    fn escaped_dots_name_one_label() {
        let o = json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "XS", "karpenter.sh/capacity-type": "on-demand"}}});
        assert_eq!(first(&o, r".metadata.labels.node\.kubernetes\.io/instance-type"), Some(json!("XS")));
        assert_eq!(first(&o, r".metadata.labels.karpenter\.sh/capacity-type"), Some(json!("on-demand")));
        // Unescaped, the dots are steps: nothing matches.
        assert_eq!(first(&o, ".metadata.labels.node.kubernetes.io/instance-type"), None);
        assert_eq!(first(&o, "{.metadata.labels['karpenter.sh/capacity-type']}"), Some(json!("on-demand")));
    }

    #[test]
    fn filters_indexes_wildcards_and_descent() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False", "n": 1}, {"type": "Ready", "status": "True", "n": 3}]}, "spec": {"l": [1, 2, 3]}});
        assert_eq!(first(&o, r#".status.conditions[?(@.type=="Ready")].status"#), Some(json!("True")));
        assert_eq!(first(&o, ".status.conditions[?(@.type == 'A')].status"), Some(json!("False")));
        assert_eq!(first(&o, ".status.conditions[?(@.n > 2)].type"), Some(json!("Ready")));
        assert_eq!(first(&o, ".spec.l[-1]"), Some(json!(3)));
        assert_eq!(JsonPath::parse(".spec.l[0:2]").unwrap().find(&o), vec![&json!(1), &json!(2)]);
        assert_eq!(JsonPath::parse(".status.conditions[*].type").unwrap().find(&o).len(), 2);
        assert_eq!(JsonPath::parse("..status").unwrap().find(&o).len(), 3);
        assert_eq!(first(&o, ".spec.missing"), None);
        assert!(JsonPath::parse(".a[").is_err());
    }

    #[test]
    fn go_text_of_values() {
        assert_eq!(go_text(&json!({"b": 1, "a": [true, "x"]})), "map[a:[true x] b:1]");
        assert_eq!(go_text(&json!(1.5)), "1.5");
    }
}
