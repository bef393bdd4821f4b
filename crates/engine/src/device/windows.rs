//! Windows: how a tensor larger than one buffer binding reaches a kernel.
//!
//! A storage binding may cover at most `max_storage_buffer_binding_size`
//! bytes (128 MiB on lavapipe and in WebGPU's defaults, 4 GiB on Vulkan
//! drivers), far less than the memory a tensor may use. So a tensor that
//! is larger is bound as several consecutive windows, each within the
//! limit and starting at an offset the device accepts, and the kernel
//! reaches element `j` through `rd_x(j)` / `wr_x(j, v)`, which pick the
//! window holding it. One mechanism for every kernel: shaders never index
//! a storage array directly, and a kernel whose tensors all fit compiles
//! exactly as before (the accessors are one indexing each, inlined).
//!
//! The cost is bindings: a dispatch may bind at most
//! `max_storage_buffers_per_shader_stage` buffers (32 on lavapipe), so the
//! windows of all its tensors together must fit in that.
//!
//! The same windows carry a tensor across buffers: a segment larger than
//! one wgpu buffer may be (`max_buffer_size`, 2 GiB on lavapipe) is backed
//! by several (`SegmentBuffers`), and a tensor whose range crosses from one
//! into the next gets a window on each side, never one across.
//!
//! On the WGSL side ([`bind_windows`]), after composing: the storage
//! declaration of binding `i` with `k` windows becomes `k` declarations
//! `x_w0 .. x_w{k-1}`, every binding is renumbered to make room, and a
//! uniform table `win_` after the last binding holds where each window
//! starts, in 4-byte words from the tensor's start. (The device then moves
//! the uniforms to bind group 1: `super::bind_groups`.)

/// Why composed WGSL cannot be split into windows (a bug in a kernel).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingProblem {
    #[error("storage binding {name} is not an array: {ty}")]
    NotAnArray { name: String, ty: String },
    #[error("storage bindings must be numbered 0.. in order; {name} is binding {binding}")]
    BindingOrder { name: String, binding: u32 },
    #[error("atomic array {0} cannot be split into windows")]
    AtomicWindows(String),
}

/// Where one window of a tensor lies: which of its segment's buffers, and
/// where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Index of the buffer in the segment (see `SegmentBuffers`).
    pub buffer: usize,
    /// Byte offset in that buffer.
    pub offset: u64,
    pub size: u64,
    /// Byte offset from the tensor's start.
    pub start: u64,
}

/// The windows that cover `size` bytes at `offset` of a segment made of
/// buffers of `piece` bytes each: none larger than `window` bytes and none
/// crossing from one buffer into the next. `window` and `piece` are
/// multiples of the offset alignment and of 16, and a tensor starts on a
/// multiple of both, so every window starts where the device accepts a
/// binding and on a whole `vec4`. A range that fits is one window.
pub fn split(offset: u64, size: u64, window: u64, piece: u64) -> Vec<Window> {
    let window = if window == 0 { u64::MAX } else { window };
    let piece = if piece == 0 { u64::MAX } else { piece };
    let mut out = Vec::new();
    let mut at = offset;
    let end = offset + size;
    loop {
        let buffer = at / piece;
        let base = buffer * piece;
        let stop = end
            .min(base.saturating_add(piece))
            .min(at.saturating_add(window));
        out.push(Window {
            buffer: buffer as usize,
            offset: at - base,
            size: stop - at,
            start: at - offset,
        });
        if stop >= end {
            return out;
        }
        at = stop;
    }
}

/// Rounds each windowed binding's count of windows up to a power of two
/// by repeating its last window, where the budget allows: `rd_x` reads a
/// repeated window's elements from the same memory, and a kernel is then
/// one of a few variants instead of one per count (each compiles in
/// seconds on a software adapter, and a product cut into parts would
/// otherwise meet many counts).
pub fn pad(windows: &mut [Vec<Window>], limit: u32) {
    let padded = |w: &Vec<Window>| {
        if w.len() > 1 {
            w.len().next_power_of_two()
        } else {
            1
        }
    };
    let total: usize = windows.iter().map(padded).sum();
    if total > limit as usize {
        return;
    }
    for w in windows.iter_mut() {
        let n = padded(w);
        if let Some(&last) = w.last() {
            w.resize(n, last);
        }
    }
}

/// The largest window a device with binding limit `limit` and offset
/// alignment `alignment` can use: `limit` rounded down to a multiple of
/// both `alignment` and 16 bytes.
pub fn window_size(limit: u64, alignment: u64) -> u64 {
    let unit = lcm(alignment.max(1), 16);
    (limit / unit * unit).max(unit)
}

pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// One storage declaration found in composed WGSL.
struct Storage {
    line: usize,
    binding: u32,
    name: String,
    elem: String,
}

/// Parses `@group(0) @binding(N) var<KIND> NAME: TYPE;` into (N, KIND,
/// NAME, TYPE).
fn declaration(line: &str) -> Option<(u32, &str, &str, &str)> {
    let rest = line.trim().strip_prefix("@group(0) @binding(")?;
    let (n, rest) = rest.split_once(')')?;
    let rest = rest.trim_start().strip_prefix("var<")?;
    let (kind, rest) = rest.split_once('>')?;
    let (name, ty) = rest.split_once(':')?;
    let ty = ty.trim().strip_suffix(';')?;
    Some((n.parse().ok()?, kind, name.trim(), ty.trim()))
}

/// The window table's entry `e`, as WGSL.
fn table(e: usize) -> String {
    format!("win_[{}u][{}u]", e / 4, e % 4)
}

/// A window start in `elem` units from its start in words.
fn in_elements(words: &str, elem: &str) -> String {
    match elem {
        "f16" => format!("({words} * 2u)"),
        e if e.starts_with("vec2") => format!("({words} / 2u)"),
        e if e.starts_with("vec4") => format!("({words} / 4u)"),
        _ => words.to_string(),
    }
}

/// Rewrites composed WGSL so storage binding `i` is bound as `counts[i]`
/// windows (missing entries: 1), and adds `rd_NAME` / `wr_NAME` for every
/// storage array that is not atomic. The kernel is then dispatched with
/// each tensor's windows in order, the uniforms after them, and the
/// window table last (when any binding has more than one window).
pub fn bind_windows(wgsl: &str, counts: &[u32]) -> Result<String, BindingProblem> {
    let lines: Vec<&str> = wgsl.lines().collect();
    let mut storage = Vec::new();
    let mut uniforms = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((binding, kind, name, ty)) = declaration(line) else {
            continue;
        };
        if kind.starts_with("storage") {
            let elem = ty
                .strip_prefix("array<")
                .and_then(|t| t.strip_suffix('>'))
                .ok_or_else(|| BindingProblem::NotAnArray {
                    name: name.to_string(),
                    ty: ty.to_string(),
                })?;
            storage.push(Storage {
                line: i,
                binding,
                name: name.to_string(),
                elem: elem.to_string(),
            });
        } else {
            uniforms.push(i);
        }
    }
    for (k, s) in storage.iter().enumerate() {
        if s.binding as usize != k {
            return Err(BindingProblem::BindingOrder {
                name: s.name.clone(),
                binding: s.binding,
            });
        }
    }
    let count = |b: u32| counts.get(b as usize).copied().unwrap_or(1).max(1);
    let windowed = storage.iter().any(|s| count(s.binding) > 1);
    if let Some(s) = storage
        .iter()
        .find(|s| count(s.binding) > 1 && s.elem.starts_with("atomic"))
    {
        return Err(BindingProblem::AtomicWindows(s.name.clone()));
    }
    let mut replaced: Vec<Option<String>> = vec![None; lines.len()];
    let mut functions = String::new();
    let mut next_binding = 0u32;
    let mut entry = 0usize;
    for s in &storage {
        let k = count(s.binding);
        let (name, elem) = (&s.name, &s.elem);
        if k == 1 {
            replaced[s.line] = Some(format!(
                "@group(0) @binding({next_binding}) var<storage, read_write> {name}: array<{elem}>;"
            ));
            next_binding += 1;
            if !elem.starts_with("atomic") {
                functions.push_str(&format!(
                    "fn rd_{name}(j_: u32) -> {elem} {{ return {name}[j_]; }}\n\
                     fn wr_{name}(j_: u32, v_: {elem}) {{ {name}[j_] = v_; }}\n"
                ));
            }
            continue;
        }
        let mut decl = String::new();
        let mut rd = format!("fn rd_{name}(j_: u32) -> {elem} {{\n");
        let mut wr = format!("fn wr_{name}(j_: u32, v_: {elem}) {{\n");
        for w in 0..k {
            decl.push_str(&format!(
                "@group(0) @binding({next_binding}) var<storage, read_write> {name}_w{w}: array<{elem}>;\n"
            ));
            next_binding += 1;
            let here = if w == 0 {
                "j_".to_string()
            } else {
                format!("j_ - {}", in_elements(&table(entry + w as usize - 1), elem))
            };
            if w + 1 < k {
                let end = in_elements(&table(entry + w as usize), elem);
                rd.push_str(&format!(
                    "    if (j_ < {end}) {{ return {name}_w{w}[{here}]; }}\n"
                ));
                wr.push_str(&format!(
                    "    if (j_ < {end}) {{ {name}_w{w}[{here}] = v_; return; }}\n"
                ));
            } else {
                rd.push_str(&format!("    return {name}_w{w}[{here}];\n}}\n"));
                wr.push_str(&format!("    {name}_w{w}[{here}] = v_;\n}}\n"));
            }
        }
        entry += k as usize - 1;
        replaced[s.line] = Some(decl.trim_end().to_string());
        functions.push_str(&rd);
        functions.push_str(&wr);
    }
    for &line in &uniforms {
        let (_, kind, name, ty) = declaration(lines[line]).expect("parsed above");
        replaced[line] = Some(format!(
            "@group(0) @binding({next_binding}) var<{kind}> {name}: {ty};"
        ));
        next_binding += 1;
    }
    let mut out = String::with_capacity(wgsl.len() + functions.len() + 64);
    for (i, line) in lines.iter().enumerate() {
        out.push_str(replaced[i].as_deref().unwrap_or(line));
        out.push('\n');
    }
    if windowed {
        out.push_str(&format!(
            "@group(0) @binding({next_binding}) var<uniform> win_: array<vec4<u32>, {}>;\n",
            entry.div_ceil(4).max(1)
        ));
    }
    out.push_str(&functions);
    Ok(out)
}

/// The window table for the given windows of each binding, in the layout
/// [`bind_windows`] reads: the start (in words) of every window but each
/// binding's first, in binding order, padded to whole `vec4`s.
pub fn table_bytes(windows: &[Vec<Window>]) -> Vec<u8> {
    let mut words: Vec<u32> = windows
        .iter()
        .flat_map(|w| w.iter().skip(1).map(|w| (w.start / 4) as u32))
        .collect();
    words.resize(words.len().div_ceil(4).max(1) * 4, 0);
    bytemuck::cast_slice(&words).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_range_in_order_within_the_limit() {
        for (size, window) in [(100u64, 256u64), (256, 256), (257, 256), (4096 + 8, 1024)] {
            let w = split(512, size, window, u64::MAX);
            assert_eq!(w.iter().map(|w| w.size).sum::<u64>(), size);
            assert!(w
                .iter()
                .all(|w| w.size <= window && w.offset == 512 + w.start && w.buffer == 0));
            assert_eq!(w.len() as u64, size.div_ceil(window));
        }
        assert_eq!(window_size(1000, 256), 768);
        assert_eq!(window_size(100, 32), 96);
        assert_eq!(window_size(10, 64), 64);
    }

    #[test]
    fn padding_repeats_the_last_window_up_to_a_power_of_two_within_the_budget() {
        let w = |n: u64| split(0, n * 16, 16, u64::MAX);
        let mut ws = vec![w(1), w(3), w(5)];
        pad(&mut ws, 32);
        assert_eq!(ws.iter().map(Vec::len).collect::<Vec<_>>(), [1, 4, 8]);
        assert_eq!(ws[1][3], ws[1][2], "the last window repeated");
        assert_eq!(ws[2][..5], w(5)[..], "the real windows unchanged");
        // Past the budget: left as they are.
        let mut ws = vec![w(5), w(5)];
        pad(&mut ws, 12);
        assert_eq!(ws.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5]);
    }

    const SHADER: &str = "\
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;
";

    #[test]
    fn one_window_each_keeps_the_bindings() {
        let out = bind_windows(SHADER, &[]).unwrap();
        assert!(out.contains("@binding(0) var<storage, read_write> x: array<f32>;"));
        assert!(out.contains("@binding(2) var<uniform> p: Params;"));
        assert!(out.contains("fn rd_x(j_: u32) -> f32 { return x[j_]; }"));
        assert!(!out.contains("win_"));
    }

    #[test]
    fn windows_renumber_and_read_the_table() {
        let out = bind_windows(SHADER, &[3, 2]).unwrap();
        for (b, decl) in ["x_w0", "x_w1", "x_w2", "y_w0", "y_w1"].iter().enumerate() {
            assert!(out.contains(&format!("@binding({b}) var<storage, read_write> {decl}:")));
        }
        assert!(out.contains("@binding(5) var<uniform> p: Params;"));
        assert!(out.contains("@binding(6) var<uniform> win_: array<vec4<u32>, 1>;"));
        // x's second window starts at entry 0, its third at entry 1; y's
        // second at entry 2, in vec4 units.
        assert!(out.contains("if (j_ < win_[0u][0u]) { return x_w0[j_]; }"));
        assert!(out.contains("return x_w2[j_ - win_[0u][1u]];"));
        assert!(out.contains("return y_w1[j_ - (win_[0u][2u] / 4u)];"));
    }

    #[test]
    fn misnumbered_or_atomic_bindings_are_refused() {
        let bad = "@group(0) @binding(1) var<storage, read_write> x: array<f32>;\n";
        assert!(bind_windows(bad, &[]).is_err());
        let atomic = "@group(0) @binding(0) var<storage, read_write> f: array<atomic<u32>>;\n";
        assert!(bind_windows(atomic, &[]).is_ok());
        assert!(bind_windows(atomic, &[2]).is_err());
    }

    /// Windows never cross a buffer boundary, cover the range in order,
    /// and each lies inside its buffer, for every offset, size, window and
    /// piece on the alignment grid.
    #[test]
    fn windows_stay_inside_one_buffer() {
        for piece in [256u64, 768, 1024, 4096] {
            for window in [256u64, 512, 1280, u64::MAX] {
                for offset in (0..6144).step_by(512) {
                    for size in [4u64, 256, 300, 1024, 2000, 5000] {
                        let w = split(offset, size, window, piece);
                        let mut next = 0;
                        for w in &w {
                            assert_eq!(w.start, next, "{offset} {size} {window} {piece}");
                            assert!(w.size > 0 && w.size <= window);
                            assert!(w.offset + w.size <= piece);
                            assert_eq!(w.buffer as u64 * piece + w.offset, offset + w.start);
                            assert_eq!(w.offset % 256, 0);
                            next += w.size;
                        }
                        assert_eq!(next, size);
                    }
                }
            }
        }
        // A range that fits a window but crosses a boundary is two windows.
        let w = split(512, 1024, u64::MAX, 1024);
        assert_eq!(
            (w.len(), w[1].buffer, w[1].offset, w[1].start),
            (2, 1, 0, 512)
        );
    }

    #[test]
    fn the_table_lists_later_window_starts_in_words() {
        let w = vec![
            split(0, 2048, 1024, u64::MAX),
            split(0, 100, 1024, u64::MAX),
            split(0, 3000, 1024, u64::MAX),
        ];
        let t: Vec<u32> = bytemuck::cast_slice(&table_bytes(&w)).to_vec();
        assert_eq!(t, vec![256, 256, 512, 0]);
    }
}
