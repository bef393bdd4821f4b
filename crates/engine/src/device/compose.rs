//! A small WGSL composer, so each kernel family is written once and its
//! element type and tile sizes are parameters rather than copies.
//!
//! Why our own: the kernels need four things — substitution, conditionals,
//! unrolled loops and element-type accessors — and naga_oil brings a module
//! system and a second WGSL front end for what one file does here. Unrolling
//! matters: llvmpipe (CI's GPU) keeps arrays indexed by loop variables in
//! memory, so a register tile must be written as named scalars, which a
//! `#for` produces.
//!
//! The language, line by line (directives start with `#` after indentation):
//! - `{{EXPR}}` anywhere: EXPR is a definition's name, an integer, or
//!   integers and names joined by `+ - * /` (usual precedence, no brackets).
//! - `#if COND` / `#else` / `#endif`: COND is `NAME` (defined and not `0` or
//!   `false`), `!NAME`, `NAME == VALUE` / `NAME != VALUE`, or `A < B` (two
//!   expressions, compared as integers).
//! - `#for VAR in A..B` … `#endfor`: the lines repeated for VAR = A..B-1 (A, B
//!   expressions), VAR usable in `{{ }}` inside; nests.
//! - `#include NAME`: a shared snippet ([`PRELUDE`] as `prelude`,
//!   the row kernels' reductions as `row_reduce`;
//!   `matmul_common` and `list_main`, expanded with the includer's
//!   definitions).
//! - `#accessors a b c`: `ld_a(i) -> f32` and `st_a(i, v: f32)` for storage
//!   arrays `a`, `b`, `c` (names may hold `{{ }}`) declared as `array<{{T}}>`, in the element type
//!   `ELEM` names (`f32`, `f16`, `bf16`), so arithmetic is always f32.
//!   `c:ELEM_C` takes the type from definition `ELEM_C` instead, `c:f32`
//!   names it outright (a matmul with f16 operands and an f32 workspace).

use std::collections::HashMap;

/// Shared by every kernel: the flat invocation index over a grid spread by
/// [`super::grid_for`], so no shader repeats that arithmetic.
pub const PRELUDE: &str = "\
// The flat index of an invocation of a 256-wide workgroup in a grid that
// grid_for spread over up to three dimensions.
fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lidx: u32) -> u32 {
    return (wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y) * 256u + lidx;
}
";

/// What the matmul kernels share (`#include matmul_common`): parameters,
/// convolution constants, bindings and B's element loader.
const MATMUL_COMMON: &str = include_str!("../../../../shaders/matmul_common.wgsl");

/// The row kernels' workgroup reductions (`#include row_reduce`): a
/// workgroup per row, its max and sum.
const ROW_REDUCE: &str = include_str!("../../../../shaders/row_reduce.wgsl");

/// What the list kernels' mains share (`#include list_main`): which item a
/// workgroup runs.
const LIST_MAIN: &str = include_str!("../../../../shaders/list_main.wgsl");

/// f32 → bf16 bits, rounding to nearest even (NaN stays NaN: its quiet bit
/// survives the shift); appended to any module whose accessors store bf16.
const BF16_BITS: &str = "
fn bf16_bits(x_: f32) -> u32 {
    let bits_ = bitcast<u32>(x_);
    if ((bits_ & 0x7fffffffu) > 0x7f800000u) { return (bits_ >> 16u) | 0x40u; }
    return (bits_ + 0x7fffu + ((bits_ >> 16u) & 1u)) >> 16u;
}
";

/// The element types a kernel family can be instantiated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    /// Needs the adapter's SHADER_F16 (WGSL `enable f16;`).
    F16,
    /// Stored two per `u32` (the high halves of f32s), computed in f32.
    Bf16,
}

impl Elem {
    /// See [`crate::tensor::DType::is_16bit`].
    pub fn is_16bit(self) -> bool {
        self != Elem::F32
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
        }
    }

    /// The WGSL type of one array element in storage.
    pub fn storage(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::Bf16 => "u32",
        }
    }
}

/// Definitions a template is composed with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defs {
    values: Vec<(String, String)>,
}

impl Defs {
    /// `ELEM` and `T` for `elem`.
    pub fn elem(elem: Elem) -> Defs {
        Defs::default()
            .with("ELEM", elem.name())
            .with("T", elem.storage())
    }

    /// The same definitions for a device without native f16: element types
    /// `f16` become packed halves (`f16p`), storage types `f16` become `u32`.
    pub fn without_native_f16(mut self) -> Defs {
        for (name, value) in &mut self.values {
            if value == "f16" {
                let storage = name == "T" || name.starts_with("T_") || name == "TC";
                *value = if storage { "u32" } else { "f16p" }.to_string();
            }
        }
        self
    }

    pub fn with(mut self, name: &str, value: impl ToString) -> Defs {
        self.set(name, value.to_string());
        self
    }

    pub fn set(&mut self, name: &str, value: String) {
        match self.values.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.values.push((name.to_string(), value)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name=value,...`, for pipeline names and headers.
    pub fn key(&self) -> String {
        self.values
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A template that could not be composed: a bug in a kernel, reported
/// with the line so it can be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shader template line {line}: {problem}")]
pub struct ComposeError {
    pub line: usize,
    #[source]
    pub problem: ShaderProblem,
}

/// What is wrong at a template's line (names are the template's own).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShaderProblem {
    #[error("#{closer} closes #{opener}")]
    Mismatched { closer: String, opener: String },
    #[error("#{0} is never closed")]
    Unclosed(String),
    #[error("#{0} without an opening directive")]
    Unopened(String),
    #[error("expected #for VAR in A..B")]
    ForSyntax,
    #[error("expected a range A..B")]
    RangeSyntax,
    #[error("unknown snippet {0}")]
    UnknownSnippet(String),
    #[error("unknown element type {0}")]
    UnknownElem(String),
    #[error("{0} is not defined")]
    Undefined(String),
    #[error("{name} = {value} is not an integer")]
    NotInteger { name: String, value: String },
    #[error("division by zero")]
    DivisionByZero,
    #[error("unclosed {{{{ in {0:?}")]
    UnclosedBraces(String),
    #[error("WINDOWS={list}: {source}")]
    Windows {
        list: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error(transparent)]
    Bindings(#[from] super::windows::BindingProblem),
}

/// Composes `template` with `defs` into plain WGSL.
pub fn compose(template: &str, defs: &Defs) -> Result<String, ComposeError> {
    let lines: Vec<&str> = template.lines().collect();
    let mut vars: HashMap<String, i64> = HashMap::new();
    let mut out = String::new();
    expand(&lines, 0, lines.len(), defs, &mut vars, &mut out)?;
    let any_f16 = defs
        .values
        .iter()
        .any(|(n, v)| n.starts_with("ELEM") && v == "f16")
        || out.contains("array<f16>");
    if any_f16 {
        out.insert_str(0, "enable f16;\n");
    }
    if out.contains("bf16_bits(") {
        out.push_str(BF16_BITS);
    }
    // `WINDOWS`: how many windows each storage binding is split into
    // (comma-separated, in binding order; see super::windows).
    let counts: Vec<u32> = match defs.get("WINDOWS") {
        Some(list) => list
            .split(',')
            .map(|c| c.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|source| {
                err(
                    0,
                    ShaderProblem::Windows {
                        list: list.to_string(),
                        source,
                    },
                )
            })?,
        None => Vec::new(),
    };
    super::windows::bind_windows(&out, &counts).map_err(|m| err(0, m.into()))
}

fn err(line: usize, problem: ShaderProblem) -> ComposeError {
    ComposeError {
        line: line + 1,
        problem,
    }
}

fn directive(line: &str) -> Option<(&str, &str)> {
    let t = line.trim_start();
    let rest = t.strip_prefix('#')?;
    let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((word, arg.trim()))
}

/// The index of the line that closes the block opened at `start` (its
/// `#else` too, for an `#if`), skipping nested blocks.
fn block_end(
    lines: &[&str],
    start: usize,
    end: usize,
) -> Result<(Option<usize>, usize), ComposeError> {
    let opener = directive(lines[start]).map(|d| d.0).unwrap_or("");
    let closer = if opener == "for" { "endfor" } else { "endif" };
    let mut depth = 0usize;
    let mut else_at = None;
    for (i, line) in lines.iter().enumerate().take(end).skip(start + 1) {
        match directive(line).map(|d| d.0) {
            Some("if") | Some("for") => depth += 1,
            Some("else") if depth == 0 && opener == "if" => else_at = Some(i),
            Some(w @ ("endif" | "endfor")) => {
                if depth == 0 {
                    if w != closer {
                        return Err(err(
                            i,
                            ShaderProblem::Mismatched {
                                closer: w.to_string(),
                                opener: opener.to_string(),
                            },
                        ));
                    }
                    return Ok((else_at, i));
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    Err(err(start, ShaderProblem::Unclosed(opener.to_string())))
}

fn expand(
    lines: &[&str],
    mut i: usize,
    end: usize,
    defs: &Defs,
    vars: &mut HashMap<String, i64>,
    out: &mut String,
) -> Result<(), ComposeError> {
    while i < end {
        let line = lines[i];
        match directive(line) {
            Some(("if", cond)) => {
                let (else_at, close) = block_end(lines, i, end)?;
                if condition(cond, defs, vars).map_err(|m| err(i, m))? {
                    expand(lines, i + 1, else_at.unwrap_or(close), defs, vars, out)?;
                } else if let Some(e) = else_at {
                    expand(lines, e + 1, close, defs, vars, out)?;
                }
                i = close + 1;
            }
            Some(("for", spec)) => {
                let (_, close) = block_end(lines, i, end)?;
                let (var, range) = spec
                    .split_once(" in ")
                    .ok_or_else(|| err(i, ShaderProblem::ForSyntax))?;
                let (a, b) = range
                    .split_once("..")
                    .ok_or_else(|| err(i, ShaderProblem::RangeSyntax))?;
                let a = eval(a, defs, vars).map_err(|m| err(i, m))?;
                let b = eval(b, defs, vars).map_err(|m| err(i, m))?;
                let var = var.trim().to_string();
                let saved = vars.get(&var).copied();
                for v in a..b {
                    vars.insert(var.clone(), v);
                    expand(lines, i + 1, close, defs, vars, out)?;
                }
                match saved {
                    Some(s) => vars.insert(var, s),
                    None => vars.remove(&var),
                };
                i = close + 1;
            }
            Some(("include", name)) => {
                match name {
                    "prelude" => out.push_str(PRELUDE),
                    "row_reduce" => out.push_str(ROW_REDUCE),
                    "matmul_common" | "list_main" => {
                        // Expanded with the includer's definitions.
                        let text = if name == "list_main" {
                            LIST_MAIN
                        } else {
                            MATMUL_COMMON
                        };
                        let snippet: Vec<&str> = text.lines().collect();
                        expand(&snippet, 0, snippet.len(), defs, vars, out)?;
                    }
                    other => return Err(err(i, ShaderProblem::UnknownSnippet(other.to_string()))),
                }
                i += 1;
            }
            Some(("accessors", names)) => {
                // Names may be built in a `#for` (`g{{t}}`).
                let names = substitute(names, defs, vars).map_err(|m| err(i, m))?;
                for spec in names.split_whitespace() {
                    let (name, elem) = match spec.split_once(':') {
                        Some((n, e)) if ["f32", "f16", "f16p", "bf16"].contains(&e) => (n, e),
                        Some((n, d)) => (
                            n,
                            defs.get(d)
                                .ok_or_else(|| err(i, ShaderProblem::Undefined(d.to_string())))?,
                        ),
                        None => (spec, defs.get("ELEM").unwrap_or("f32")),
                    };
                    out.push_str(&accessors(name, elem).map_err(|m| err(i, m))?);
                }
                i += 1;
            }
            Some((w @ ("else" | "endif" | "endfor"), _)) => {
                return Err(err(i, ShaderProblem::Unopened(w.to_string())));
            }
            _ => {
                out.push_str(&substitute(line, defs, vars).map_err(|m| err(i, m))?);
                out.push('\n');
                i += 1;
            }
        }
    }
    Ok(())
}

/// Loads and stores of storage array `a` as f32, in element type `elem`.
fn accessors(a: &str, elem: &str) -> Result<String, ShaderProblem> {
    // st2_{a}(w, v, n) writes elements 2w and 2w+1 (the second only when
    // 2w+1 < n): one invocation per word, so packed bf16 words are never
    // shared between invocations.
    Ok(match elem {
        "f32" => format!(
            "fn ld_{a}(ix_: u32) -> f32 {{ return rd_{a}(ix_); }}\n\
             fn st_{a}(ix_: u32, val_: f32) {{ wr_{a}(ix_, val_); }}\n\
             fn st2_{a}(wi_: u32, val_: vec2<f32>, n_: u32) {{\n\
             \x20   wr_{a}(2u * wi_, val_.x);\n\
             \x20   if (2u * wi_ + 1u < n_) {{ wr_{a}(2u * wi_ + 1u, val_.y); }}\n\
             }}\n"
        ),
        "f16" => format!(
            "fn ld_{a}(ix_: u32) -> f32 {{ return f32(rd_{a}(ix_)); }}\n\
             fn st_{a}(ix_: u32, val_: f32) {{ wr_{a}(ix_, f16(val_)); }}\n\
             fn st2_{a}(wi_: u32, val_: vec2<f32>, n_: u32) {{\n\
             \x20   wr_{a}(2u * wi_, f16(val_.x));\n\
             \x20   if (2u * wi_ + 1u < n_) {{ wr_{a}(2u * wi_ + 1u, f16(val_.y)); }}\n\
             }}\n"
        ),
        // f16 on a device without native f16: two halves per word (element
        // i is the low half for even i), converted by WGSL's core builtins.
        "f16p" => format!(
            "fn ld_{a}(ix_: u32) -> f32 {{ return unpack2x16float(rd_{a}(ix_ >> 1u))[ix_ & 1u]; }}\n\
             fn st_{a}(ix_: u32, val_: f32) {{\n\
             \x20   let o_ = unpack2x16float(rd_{a}(ix_ >> 1u));\n\
             \x20   wr_{a}(ix_ >> 1u, pack2x16float(select(vec2<f32>(val_, o_.y), vec2<f32>(o_.x, val_), (ix_ & 1u) == 1u)));\n\
             }}\n\
             fn st2_{a}(wi_: u32, val_: vec2<f32>, n_: u32) {{\n\
             \x20   wr_{a}(wi_, pack2x16float(vec2<f32>(val_.x, select(0.0, val_.y, 2u * wi_ + 1u < n_))));\n\
             }}\n"
        ),
        // Element i is the low (even i) or high (odd i) half of word i/2;
        // a bf16 is the top 16 bits of an f32. Stores round to nearest
        // even. st_ rewrites its half of the word: callers give each word
        // to one invocation (st2_ writes a whole word; past n, a zero half).
        "bf16" => format!(
            "fn ld_{a}(ix_: u32) -> f32 {{\n\
             \x20   let w_ = rd_{a}(ix_ >> 1u);\n\
             \x20   return bitcast<f32>(select(w_ << 16u, w_ & 0xffff0000u, (ix_ & 1u) == 1u));\n\
             }}\n\
             fn st_{a}(ix_: u32, val_: f32) {{\n\
             \x20   let h_ = bf16_bits(val_);\n\
             \x20   let w_ = rd_{a}(ix_ >> 1u);\n\
             \x20   wr_{a}(ix_ >> 1u, select((w_ & 0xffff0000u) | h_, (w_ & 0xffffu) | (h_ << 16u), (ix_ & 1u) == 1u));\n\
             }}\n\
             fn st2_{a}(wi_: u32, val_: vec2<f32>, n_: u32) {{\n\
             \x20   let hi_ = select(0u, bf16_bits(val_.y), 2u * wi_ + 1u < n_);\n\
             \x20   wr_{a}(wi_, bf16_bits(val_.x) | (hi_ << 16u));\n\
             }}\n"
        ),
        other => return Err(ShaderProblem::UnknownElem(other.to_string())),
    })
}

fn condition(cond: &str, defs: &Defs, vars: &HashMap<String, i64>) -> Result<bool, ShaderProblem> {
    let value = |name: &str| -> Option<String> {
        let name = name.trim();
        vars.get(name)
            .map(|v| v.to_string())
            .or_else(|| defs.get(name).map(str::to_string))
    };
    // `A < B`: both sides integer expressions (a loop variable against a
    // definition: the last, partial slice of an unrolled K range).
    if let Some((l, r)) = cond.split_once(" < ") {
        return Ok(eval(l, defs, vars)? < eval(r, defs, vars)?);
    }
    if let Some((l, r)) = cond.split_once("==") {
        return Ok(value(l).as_deref() == Some(r.trim()));
    }
    if let Some((l, r)) = cond.split_once("!=") {
        return Ok(value(l).as_deref() != Some(r.trim()));
    }
    let (negate, name) = match cond.strip_prefix('!') {
        Some(n) => (true, n),
        None => (false, cond),
    };
    let truthy = matches!(value(name), Some(v) if v != "0" && v != "false");
    Ok(truthy != negate)
}

fn atom(s: &str, defs: &Defs, vars: &HashMap<String, i64>) -> Result<i64, ShaderProblem> {
    let s = s.trim();
    if let Ok(v) = s.parse::<i64>() {
        return Ok(v);
    }
    if let Some(v) = vars.get(s) {
        return Ok(*v);
    }
    match defs.get(s) {
        Some(v) => v.parse::<i64>().map_err(|_| ShaderProblem::NotInteger {
            name: s.to_string(),
            value: v.to_string(),
        }),
        None => Err(ShaderProblem::Undefined(s.to_string())),
    }
}

/// Integer arithmetic over `+ - * /`, products first.
fn eval(expr: &str, defs: &Defs, vars: &HashMap<String, i64>) -> Result<i64, ShaderProblem> {
    let mut total = 0i64;
    let mut sign = 1i64;
    let mut term = String::new();
    let flush = |term: &str, sign: i64, total: &mut i64| -> Result<(), ShaderProblem> {
        let mut value: Option<i64> = None;
        let mut op = '*';
        let mut factor = String::new();
        for c in term.chars().chain(std::iter::once('*')) {
            if c == '*' || c == '/' {
                let f = atom(&factor, defs, vars)?;
                value = Some(match (value, op) {
                    (None, _) => f,
                    (Some(v), '*') => v * f,
                    (Some(_), _) if f == 0 => return Err(ShaderProblem::DivisionByZero),
                    (Some(v), _) => v / f,
                });
                op = c;
                factor.clear();
            } else {
                factor.push(c);
            }
        }
        *total += sign * value.unwrap_or(0);
        Ok(())
    };
    for c in expr.chars() {
        if (c == '+' || c == '-') && !term.trim().is_empty() {
            flush(&term, sign, &mut total)?;
            term.clear();
            sign = if c == '+' { 1 } else { -1 };
        } else {
            term.push(c);
        }
    }
    flush(&term, sign, &mut total)?;
    Ok(total)
}

fn substitute(
    line: &str,
    defs: &Defs,
    vars: &HashMap<String, i64>,
) -> Result<String, ShaderProblem> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| ShaderProblem::UnclosedBraces(line.to_string()))?;
        let expr = after[..close].trim();
        match defs.get(expr) {
            Some(v) if !vars.contains_key(expr) => out.push_str(v),
            _ => out.push_str(&eval(expr, defs, vars)?.to_string()),
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_unrolls_and_branches() {
        let t = "let x: {{T}} = {{N*2+1}};\n#for i in 0..N\n#if i == 1\none {{i}}\n#else\nv{{i}}_{{N-i}}\n#endif\n#endfor\n#if !BIG\nsmall\n#endif";
        let defs = Defs::elem(Elem::F32).with("N", 3);
        let got = compose(t, &defs).unwrap();
        assert_eq!(got, "let x: f32 = 7;\nv0_3\none 1\nv2_1\nsmall\n", "{got}");
    }

    #[test]
    fn accessors_take_names_built_in_a_loop() {
        let t = "#for t in 0..2\n#accessors g{{t}}\n#endfor";
        let got = compose(t, &Defs::elem(Elem::F32)).unwrap();
        assert!(
            got.contains("fn ld_g0(") && got.contains("fn st2_g1("),
            "{got}"
        );
    }

    #[test]
    fn less_than_compares_expressions() {
        let t = "#for k in 0..S*4\n#if k < K\n{{k}}\n#endif\n#endfor";
        let defs = Defs::default().with("S", 2).with("K", 6);
        assert_eq!(compose(t, &defs).unwrap(), "0\n1\n2\n3\n4\n5\n");
        let bad = compose("#if k < 3\nx\n#endif", &Defs::default());
        assert!(bad.is_err(), "an unknown name is an error, not false");
    }

    #[test]
    fn element_types_change_storage_and_accessors() {
        let t = "var<storage, read_write> a: array<{{T}}>;\n#accessors a";
        let f16 = compose(t, &Defs::elem(Elem::F16)).unwrap();
        assert!(f16.starts_with("enable f16;\n"));
        assert!(f16.contains("array<f16>") && f16.contains("f32(rd_a(ix_))"));
        let bf16 = compose(t, &Defs::elem(Elem::Bf16)).unwrap();
        assert!(bf16.contains("array<u32>") && bf16.contains("bitcast<f32>"));
        // A bf16 store brings its rounding helper, once.
        assert_eq!(bf16.matches("fn bf16_bits").count(), 1);
        // Accessor parameters never shadow an array named like them.
        let v = compose("#accessors v w n", &Defs::elem(Elem::Bf16)).unwrap();
        assert!(!v.contains("(v: ") && !v.contains("(w: ") && !v.contains(" n: "));
        // Per-array types: f32 operands with an f16 output, and a literal.
        let mixed = compose(
            "#accessors a c:ELEM_C w:f32",
            &Defs::elem(Elem::F32).with("ELEM_C", "f16"),
        )
        .unwrap();
        assert!(mixed.starts_with("enable f16;\n"));
        assert!(
            mixed.contains("wr_c(ix_, f16(val_))")
                && mixed.contains("fn ld_w(ix_: u32) -> f32 { return rd_w(ix_); }")
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = compose("ok\n#if A\nx", &Defs::default()).unwrap_err();
        assert_eq!(e.line, 2);
        let e = compose("{{MISSING}}", &Defs::default()).unwrap_err();
        assert!(e.to_string().contains("MISSING"), "{e}");
        let e = compose("#for i in 0..2\n#endif", &Defs::default()).unwrap_err();
        assert!(e.to_string().contains("closes"), "{e}");
        assert!(compose("{{4/0}}", &Defs::default()).is_err());
    }

    #[test]
    fn bf16_round_trip_in_rust_matches_the_shader_formula() {
        // The same rounding the bf16 store does, checked on a few values.
        let round = |v: f32| {
            let bits = v.to_bits();
            let h = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1))) >> 16;
            f32::from_bits(h << 16)
        };
        for v in [1.0f32, -2.5, 3.3, 1e-3, 65504.0] {
            let r = round(v);
            assert_eq!(r, half::bf16::from_f32(v).to_f32(), "{v}");
        }
    }
}
