//! Go templates, the part of them HAProxy configurations for SIP use (pure).
//!
//! Airship SIP renders its load balancers' `haproxy.cfg` from a template in
//! the ConfigMaps `loadbalancercontrolplane` / `loadbalancerworker` with Go's
//! `html/template`. nodewarden renders the same templates with this subset:
//! text; `{{- ` / ` -}}` trimming; comments; `.`, `.Field.Field`, `$`,
//! `$var.Field`, string, number and boolean literals; `$v := …` and
//! `$v = …`; `if` / `else if` / `else`, `range` (with `$e :=` or
//! `$i, $e :=`, and `else`), `with`; and `end`. Printed values are
//! HTML-escaped as `html/template` does in text. Anything else (functions,
//! pipes, `template`, `define`, `block`, `break`, …) is refused up front,
//! naming the construct and its line, never rendered differently.

use std::collections::BTreeMap;

use crate::error::Category;

/// A value the template reads: the data given to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A list (Go slice).
    List(Vec<Value>),
    /// A struct or map: field name → value.
    Map(BTreeMap<String, Value>),
}

impl Value {
    /// A struct from (field, value) pairs.
    pub fn record<const N: usize>(fields: [(&str, Value); N]) -> Value {
        Value::Map(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    fn truthy(&self) -> bool {
        match self {
            Value::Str(s) => !s.is_empty(),
            Value::Int(i) => *i != 0,
            Value::Bool(b) => *b,
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
        }
    }

    /// As Go's fmt prints it.
    fn print(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::List(l) => format!("[{}]", l.iter().map(Value::print).collect::<Vec<_>>().join(" ")),
            Value::Map(m) => format!(
                "{{{}}}",
                m.values().map(Value::print).collect::<Vec<_>>().join(" ")
            ),
        }
    }
}

/// Why a template was not rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A construct of Go templates this renderer does not implement.
    #[error("line {line}: {construct} is not supported")]
    Unsupported {
        /// What it is, as written.
        construct: String,
        /// Where (1-based).
        line: usize,
    },
    /// Not a well-formed template.
    #[error("line {line}: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
        /// Where (1-based).
        line: usize,
    },
    /// The template reads something the data does not have.
    #[error("line {line}: {reason}")]
    Execution {
        /// What failed.
        reason: String,
        /// Where (1-based).
        line: usize,
    },
}

impl TemplateError {
    /// The error's category: the template is an object nodewarden cannot use as it is.
    pub fn category(&self) -> Category {
        Category::InvalidObject
    }
}

/// What an action reads: one operand (no functions, no pipes).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Operand {
    /// `.` then fields.
    Dot(Vec<String>),
    /// `$name` then fields (`$` is the data itself).
    Var(String, Vec<String>),
    /// A literal.
    Literal(Value),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Text(String),
    Print(Operand, usize),
    Assign {
        var: String,
        value: Operand,
        declare: bool,
        line: usize,
    },
    If {
        branches: Vec<(Operand, Vec<Node>)>,
        otherwise: Vec<Node>,
        line: usize,
    },
    Range {
        index: Option<String>,
        element: Option<String>,
        over: Operand,
        body: Vec<Node>,
        otherwise: Vec<Node>,
        line: usize,
    },
    With {
        value: Operand,
        body: Vec<Node>,
        otherwise: Vec<Node>,
        line: usize,
    },
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    nodes: Vec<Node>,
}

/// A piece of the source: text, or an action's inside and its line.
enum Piece {
    Text(String),
    Action(String, usize),
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Splits the source into text and actions, applying the trim markers and
/// dropping comments.
fn pieces(source: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = source;
    let mut line = 1;
    let mut trim_next = false;
    while !rest.is_empty() {
        let text_end = rest.find("{{").unwrap_or(rest.len());
        no_markup(&rest[..text_end], line)?;
        let Some(open) = rest.find("{{") else {
            let text = if trim_next {
                rest.trim_start_matches(is_space)
            } else {
                rest
            };
            out.push(Piece::Text(text.replace('<', "&lt;")));
            break;
        };
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start_matches(is_space);
        }
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 2..];
        let trim_left = after.starts_with('-') && after[1..].starts_with(is_space);
        if trim_left {
            text = text.trim_end_matches(is_space);
        }
        out.push(Piece::Text(text.replace('<', "&lt;")));
        let inner_start = if trim_left { 1 } else { 0 };
        let close = closing(after, line)?;
        let mut inner = &after[inner_start..close];
        trim_next = inner.ends_with('-') && inner[..inner.len() - 1].ends_with(is_space);
        if trim_next {
            inner = &inner[..inner.len() - 1];
        }
        let inner = inner.trim_matches(is_space);
        if !(inner.starts_with("/*") && inner.ends_with("*/")) {
            out.push(Piece::Action(inner.to_string(), line));
        }
        line += after[..close].matches('\n').count();
        rest = &after[close + 2..];
    }
    Ok(out)
}

/// Refuses HTML markup in the text (`<a`, `</`, `<!`): upstream's
/// html/template reads the text as HTML and escapes each value by where it
/// stands (inside a tag, an attribute, a script) and drops HTML comments;
/// this renderer escapes every value as text, so it renders only text (any
/// other `<` becomes `&lt;`, as html/template writes it).
fn no_markup(text: &str, line: usize) -> Result<(), TemplateError> {
    for (i, _) in text.match_indices('<') {
        let next = text[i + 1..].chars().next();
        if next.is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '/' | '!' | '?')) {
            let at = line + text[..i].matches('\n').count();
            let tag: String = text[i..]
                .chars()
                .take_while(|c| !c.is_whitespace())
                .take(12)
                .collect();
            return Err(unsupported(format!("HTML markup `{tag}` in the text"), at));
        }
    }
    Ok(())
}

/// Where the action that `s` begins closes (`}}` outside quotes and comments).
fn closing(s: &str, line: usize) -> Result<usize, TemplateError> {
    let unclosed = || TemplateError::Malformed {
        reason: "unclosed action".into(),
        line,
    };
    let trimmed = s.trim_start_matches(['-', ' ', '\t', '\r', '\n']);
    if trimmed.starts_with("/*") {
        let skip = s.len() - trimmed.len();
        let end = trimmed.find("*/").ok_or_else(unclosed)?;
        let from = skip + end + 2;
        return s[from..].find("}}").map(|i| from + i).ok_or_else(unclosed);
    }
    let mut quotes = Quotes::default();
    for (i, c) in s.char_indices() {
        if !quotes.inside(c) && s[i..].starts_with("}}") {
            return Ok(i);
        }
    }
    Err(unclosed())
}

/// Whether a character is inside a quoted string (`"…"` with `\` escapes,
/// or a raw `` `…` ``), fed one character at a time.
#[derive(Default)]
struct Quotes {
    open: Option<char>,
    escaped: bool,
}

impl Quotes {
    /// Whether `c` belongs to a quoted string (its quotes included).
    fn inside(&mut self, c: char) -> bool {
        match self.open {
            Some(q) => {
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' && q == '"' {
                    self.escaped = true;
                } else if c == q {
                    self.open = None;
                }
                true
            }
            None if c == '"' || c == '`' => {
                self.open = Some(c);
                true
            }
            None => false,
        }
    }
}

/// An action's words, quoted strings kept whole.
fn words(action: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quotes = Quotes::default();
    for c in action.chars() {
        if !quotes.inside(c) && is_space(c) {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn unsupported(construct: impl Into<String>, line: usize) -> TemplateError {
    TemplateError::Unsupported {
        construct: construct.into(),
        line,
    }
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// `.A.B` → ["A", "B"]; `.` → [].
fn fields(s: &str, line: usize) -> Result<Vec<String>, TemplateError> {
    if s == "." || s.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = s.strip_prefix('.') else {
        return Err(unsupported(format!("`{s}`"), line));
    };
    rest.split('.')
        .map(|f| match is_ident(f) {
            true => Ok(f.to_string()),
            false => Err(unsupported(format!("`{s}`"), line)),
        })
        .collect()
}

/// One operand, or what it is that is not supported.
fn operand(words: &[String], line: usize) -> Result<Operand, TemplateError> {
    let all = words.join(" ");
    if words.iter().any(|w| w == "|") {
        return Err(unsupported(format!("the pipe in `{all}`"), line));
    }
    if all.starts_with('(') {
        return Err(unsupported(format!("the parenthesized `{all}`"), line));
    }
    let [word] = words else {
        return Err(match words.first() {
            None => TemplateError::Malformed {
                reason: "missing value".into(),
                line,
            },
            Some(f) if is_ident(f) => unsupported(format!("the function `{f}` in `{all}`"), line),
            Some(_) => unsupported(format!("`{all}`"), line),
        });
    };
    let w = word.as_str();
    if w.starts_with('.') {
        return Ok(Operand::Dot(fields(w, line)?));
    }
    if let Some(var) = w.strip_prefix('$') {
        let (name, path) = match var.find('.') {
            Some(i) => (&var[..i], &var[i..]),
            None => (var, ""),
        };
        if !name.is_empty() && !is_ident(name) {
            return Err(unsupported(format!("`{w}`"), line));
        }
        return Ok(Operand::Var(format!("${name}"), fields(path, line)?));
    }
    if let Some(s) = w.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Ok(Operand::Literal(Value::Str(unquote(s))));
    }
    if let Some(s) = w.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
        return Ok(Operand::Literal(Value::Str(s.to_string())));
    }
    if let Ok(i) = w.parse::<i64>() {
        return Ok(Operand::Literal(Value::Int(i)));
    }
    match w {
        "true" => Ok(Operand::Literal(Value::Bool(true))),
        "false" => Ok(Operand::Literal(Value::Bool(false))),
        _ if is_ident(w) => Err(unsupported(format!("the function `{w}`"), line)),
        _ => Err(unsupported(format!("`{w}`"), line)),
    }
}

fn unquote(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// How a block ended.
enum Close {
    End,
    Else(Vec<String>, usize),
    Eof,
}

struct Parser {
    pieces: std::vec::IntoIter<Piece>,
}

impl Parser {
    /// Nodes up to the `end` or `else` that closes the block (or the end of input).
    fn block(&mut self) -> Result<(Vec<Node>, Close), TemplateError> {
        let mut nodes = Vec::new();
        while let Some(piece) = self.pieces.next() {
            let (action, line) = match piece {
                Piece::Text(t) => {
                    if !t.is_empty() {
                        nodes.push(Node::Text(t));
                    }
                    continue;
                }
                Piece::Action(a, line) => (a, line),
            };
            let w = words(&action);
            match w.first().map(String::as_str) {
                None => {
                    return Err(TemplateError::Malformed {
                        reason: "empty action".into(),
                        line,
                    });
                }
                Some("end") => return Ok((nodes, Close::End)),
                Some("else") => return Ok((nodes, Close::Else(w[1..].to_vec(), line))),
                Some("if") => nodes.push(self.if_chain(&w[1..], line)?),
                Some("range") => nodes.push(self.range(&w[1..], line)?),
                Some("with") => {
                    let value = operand(&w[1..], line)?;
                    let (body, otherwise) = self.body_else("with", line)?;
                    nodes.push(Node::With {
                        value,
                        body,
                        otherwise,
                        line,
                    });
                }
                Some(k @ ("define" | "template" | "block" | "break" | "continue")) => {
                    return Err(unsupported(format!("`{k}`"), line));
                }
                Some(_) if w.len() >= 2 && (w[1] == ":=" || w[1] == "=") => {
                    if !w[0].starts_with('$') {
                        return Err(unsupported(format!("`{action}`"), line));
                    }
                    nodes.push(Node::Assign {
                        var: w[0].clone(),
                        value: operand(&w[2..], line)?,
                        declare: w[1] == ":=",
                        line,
                    });
                }
                Some(_) => nodes.push(Node::Print(operand(&w, line)?, line)),
            }
        }
        Ok((nodes, Close::Eof))
    }

    /// A block's body and its `else` part, closed by `end`.
    fn body_else(&mut self, what: &str, line: usize) -> Result<(Vec<Node>, Vec<Node>), TemplateError> {
        let (body, close) = self.block()?;
        match close {
            Close::End => Ok((body, Vec::new())),
            Close::Else(rest, _) if rest.is_empty() => {
                let (otherwise, close) = self.block()?;
                match close {
                    Close::End => Ok((body, otherwise)),
                    _ => Err(unclosed(what, line)),
                }
            }
            Close::Else(rest, l) => Err(unsupported(format!("`else {}` in {what}", rest.join(" ")), l)),
            Close::Eof => Err(unclosed(what, line)),
        }
    }

    fn if_chain(&mut self, cond: &[String], line: usize) -> Result<Node, TemplateError> {
        let mut branches = vec![(operand(cond, line)?, Vec::new())];
        loop {
            let (body, close) = self.block()?;
            if let Some(last) = branches.last_mut() {
                last.1 = body;
            }
            match close {
                Close::End => {
                    return Ok(Node::If {
                        branches,
                        otherwise: Vec::new(),
                        line,
                    });
                }
                Close::Else(rest, _) if rest.is_empty() => {
                    let (otherwise, close) = self.block()?;
                    return match close {
                        Close::End => Ok(Node::If {
                            branches,
                            otherwise,
                            line,
                        }),
                        _ => Err(unclosed("if", line)),
                    };
                }
                Close::Else(rest, l) if rest[0] == "if" => {
                    branches.push((operand(&rest[1..], l)?, Vec::new()))
                }
                Close::Else(rest, l) => return Err(unsupported(format!("`else {}`", rest.join(" ")), l)),
                Close::Eof => return Err(unclosed("if", line)),
            }
        }
    }

    fn range(&mut self, w: &[String], line: usize) -> Result<Node, TemplateError> {
        let (index, element, over) = match w.iter().position(|x| x == ":=" || x == "=") {
            None => (None, None, operand(w, line)?),
            Some(at) => {
                let vars: Vec<String> = w[..at]
                    .join(" ")
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .collect();
                if vars.iter().any(|v| !v.starts_with('$')) || vars.len() > 2 {
                    return Err(unsupported(format!("`range {}`", w.join(" ")), line));
                }
                let over = operand(&w[at + 1..], line)?;
                match vars.as_slice() {
                    [e] => (None, Some(e.clone()), over),
                    [i, e] => (Some(i.clone()), Some(e.clone()), over),
                    _ => return Err(unsupported(format!("`range {}`", w.join(" ")), line)),
                }
            }
        };
        let (body, otherwise) = self.body_else("range", line)?;
        Ok(Node::Range {
            index,
            element,
            over,
            body,
            otherwise,
            line,
        })
    }
}

fn unclosed(what: &str, line: usize) -> TemplateError {
    TemplateError::Malformed {
        reason: format!("`{what}` without `end`"),
        line,
    }
}

impl Template {
    /// Parses a template, refusing what is not supported.
    pub fn parse(source: &str) -> Result<Template, TemplateError> {
        let mut parser = Parser {
            pieces: pieces(source)?.into_iter(),
        };
        match parser.block()? {
            (nodes, Close::Eof) => Ok(Template { nodes }),
            (_, Close::End) => Err(TemplateError::Malformed {
                reason: "`end` without a block".into(),
                line: 0,
            }),
            (_, Close::Else(_, line)) => Err(TemplateError::Malformed {
                reason: "`else` without a block".into(),
                line,
            }),
        }
    }

    /// Renders the template over `data`.
    pub fn render(&self, data: &Value) -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut vars = vec![("$".to_string(), data.clone())];
        execute(&self.nodes, data, &mut vars, &mut out)?;
        Ok(out)
    }
}

type Vars = Vec<(String, Value)>;

fn lookup(op: &Operand, dot: &Value, vars: &Vars, line: usize) -> Result<Value, TemplateError> {
    let (start, path) = match op {
        Operand::Literal(v) => return Ok(v.clone()),
        Operand::Dot(path) => (dot.clone(), path),
        Operand::Var(name, path) => {
            let v = vars
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| TemplateError::Execution {
                    reason: format!("undefined variable {name}"),
                    line,
                })?;
            (v, path)
        }
    };
    path.iter().try_fold(start, |v, field| match v {
        Value::Map(mut m) => m.remove(field).ok_or_else(|| TemplateError::Execution {
            reason: format!("can't evaluate field {field}"),
            line,
        }),
        other => Err(TemplateError::Execution {
            reason: format!("can't evaluate field {field} in {}", other.print()),
            line,
        }),
    })
}

/// What `html/template` makes of a value printed in text.
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push('\u{FFFD}'),
            '"' => out.push_str("&#34;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '+' => out.push_str("&#43;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Runs nodes; variables declared inside a block end with it.
fn scoped(nodes: &[Node], dot: &Value, vars: &mut Vars, out: &mut String) -> Result<(), TemplateError> {
    let depth = vars.len();
    let result = execute(nodes, dot, vars, out);
    vars.truncate(depth);
    result
}

fn execute(nodes: &[Node], dot: &Value, vars: &mut Vars, out: &mut String) -> Result<(), TemplateError> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Print(op, line) => out.push_str(&escape_html(&lookup(op, dot, vars, *line)?.print())),
            Node::Assign {
                var,
                value,
                declare,
                line,
            } => {
                let v = lookup(value, dot, vars, *line)?;
                if *declare {
                    vars.push((var.clone(), v));
                } else {
                    let slot = vars.iter_mut().rev().find(|(n, _)| n == var).ok_or_else(|| {
                        TemplateError::Execution {
                            reason: format!("undefined variable {var}"),
                            line: *line,
                        }
                    })?;
                    slot.1 = v;
                }
            }
            Node::If {
                branches,
                otherwise,
                line,
            } => {
                let mut taken = None;
                for (cond, body) in branches {
                    if lookup(cond, dot, vars, *line)?.truthy() {
                        taken = Some(body);
                        break;
                    }
                }
                scoped(taken.unwrap_or(otherwise), dot, vars, out)?;
            }
            Node::With {
                value,
                body,
                otherwise,
                line,
            } => {
                let v = lookup(value, dot, vars, *line)?;
                match v.truthy() {
                    true => scoped(body, &v, vars, out)?,
                    false => scoped(otherwise, dot, vars, out)?,
                }
            }
            Node::Range {
                index,
                element,
                over,
                body,
                otherwise,
                line,
            } => {
                let items: Vec<(Value, Value)> = match lookup(over, dot, vars, *line)? {
                    Value::List(l) => l
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| (Value::Int(i64::try_from(i).unwrap_or(i64::MAX)), v))
                        .collect(),
                    Value::Map(m) => m.into_iter().map(|(k, v)| (Value::Str(k), v)).collect(),
                    other => {
                        return Err(TemplateError::Execution {
                            reason: format!("range can't iterate over {}", other.print()),
                            line: *line,
                        });
                    }
                };
                if items.is_empty() {
                    scoped(otherwise, dot, vars, out)?;
                }
                for (i, v) in items {
                    let depth = vars.len();
                    if let Some(name) = index {
                        vars.push((name.clone(), i));
                    }
                    if let Some(name) = element {
                        vars.push((name.clone(), v.clone()));
                    }
                    let result = execute(body, &v, vars, out);
                    vars.truncate(depth);
                    result?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Value {
        let port = |name: &str, p: i64| {
            Value::record([
                ("Name", Value::Str(name.into())),
                ("ContainerPort", Value::Int(p)),
            ])
        };
        let server = |name: &str, ip: &str| {
            Value::record([("Name", Value::Str(name.into())), ("IP", Value::Str(ip.into()))])
        };
        Value::record([
            (
                "ContainerPorts",
                Value::List(vec![port("port-30002", 30002), port("port-30003", 30003)]),
            ),
            (
                "Servers",
                Value::List(vec![server("w-1", "10.0.0.1"), server("w-2", "10.0.0.2")]),
            ),
            ("Empty", Value::List(Vec::new())),
            ("Note", Value::Str("a<b & 'c'+\"d\"".into())),
        ])
    }

    fn render(source: &str) -> Result<String, TemplateError> {
        Template::parse(source)?.render(&data())
    }

    /// (template, what it renders): each output is what Go's html/template
    /// printed for the same template over the same data (as structs).
    #[test]
    fn renders_as_go_does() {
        let cases = [
            ("plain text\n", "plain text\n"),
            ("a {{- \" b \" -}} c", "a b c"),
            ("a  \n {{- /* a comment */ -}} \n b", "ab"),
            ("x{{/* no trim */}}y", "xy"),
            (
                "{{ range .Servers }}{{ .Name }}={{ .IP }};{{ end }}",
                "w-1=10.0.0.1;w-2=10.0.0.2;",
            ),
            (
                "{{ range $i, $s := .Servers }}{{ $i }}:{{ $s.Name }} {{ end }}",
                "0:w-1 1:w-2 ",
            ),
            // Upstream's shape: a variable outside, a nested range, trim markers.
            (
                "head\n{{- $servers := .Servers }}\n{{- range .ContainerPorts }}\n{{- $p := . }}\nbind *:{{ $p.ContainerPort }}\n{{- range $servers }}\n  server {{ .Name }} {{ .IP }}:{{ $p.ContainerPort }}\n{{ end -}}\n{{ end -}}\n",
                "head\nbind *:30002\n  server w-1 10.0.0.1:30002\n\n  server w-2 10.0.0.2:30002\n\nbind *:30003\n  server w-1 10.0.0.1:30003\n\n  server w-2 10.0.0.2:30003\n",
            ),
            ("{{ range .Empty }}x{{ else }}none{{ end }}", "none"),
            ("{{ if .Empty }}a{{ else if .Servers }}b{{ else }}c{{ end }}", "b"),
            (
                "{{ with $.Servers }}ok{{ end }}{{ with .Empty }}x{{ else }}y{{ end }}",
                "oky",
            ),
            ("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}", "2"),
            ("{{ .Note }}", "a&lt;b &amp; &#39;c&#39;&#43;&#34;d&#34;"),
            (
                "timeout < 5 {{ 1 }} x <= 2 & y > 1",
                "timeout &lt; 5 1 x &lt;= 2 & y > 1",
            ),
            ("{{ $.Servers }}", "[{10.0.0.1 w-1} {10.0.0.2 w-2}]"),
        ];
        for (source, want) in cases {
            assert_eq!(render(source).as_deref(), Ok(want), "{source}");
        }
    }

    /// (template, the construct the error names).
    #[test]
    fn refuses_what_it_cannot_render_naming_it() {
        let cases = [
            ("{{ len .Servers }}", "the function `len`"),
            ("{{ .Servers | len }}", "the pipe"),
            ("x\n{{ printf \"%d\" 1 }}", "line 2: the function `printf`"),
            ("{{ template \"x\" }}", "`template`"),
            ("{{ define \"x\" }}{{ end }}", "`define`"),
            ("{{ range .Servers }}{{ break }}{{ end }}", "`break`"),
            ("{{ (index .Servers 0) }}", "the parenthesized"),
            ("a\n# <b>{{ .Note }}</b>", "line 2: HTML markup `<b>`"),
            (
                "{{ if .Servers }}x{{ else with .Note }}y{{ end }}",
                "`else with .Note`",
            ),
        ];
        for (source, construct) in cases {
            let err = render(source).expect_err(source);
            assert!(
                matches!(err, TemplateError::Unsupported { .. }),
                "{source}: {err:?}"
            );
            assert!(err.to_string().contains(construct), "{source}: {err}");
        }
        for bad in [
            "{{ if .Servers }}x",
            "{{ end }}",
            "{{ .Servers ",
            "{{ .Missing }}",
        ] {
            assert!(render(bad).is_err(), "{bad}");
        }
    }
}
