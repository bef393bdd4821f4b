//! Flat dispatches past the binding budget (elements, or whole rows).
//!
//! Windows let a kernel reach a tensor of any size, but every window is a
//! binding, and a dispatch binds at most `max_storage_buffers_per_shader_stage`
//! buffers (32 on lavapipe: 4 GiB of tensors per kernel in 128 MiB windows).
//! A flat kernel, whose invocation `i` touches only elements
//! `[i·per, (i+1)·per)` of each tensor it splits (the elementwise ops,
//! casts, fills and the optimizers' updates; with a row as the element,
//! softmax, layer norm and the cross-entropy forward), therefore runs as several
//! dispatches over consecutive element ranges, each binding only the
//! windows of its own range, with the element count its params begin with
//! set to the range's. A flat kernel whose windows fit runs as one
//! dispatch, exactly as before.

use super::windows::{gcd, lcm};

/// How one binding of a flat kernel relates to the kernel's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Element `e` lies at bytes `[e·b, (e+1)·b)` of the binding: each
    /// range binds its own part.
    Elements(u64),
    /// Bound whole by every range (a flag, a scalar).
    Whole,
}

/// A flat kernel's shape: how many elements, how many each invocation
/// handles (2 for the pairwise kernels, 4 for `vec4` ones), the workgroup
/// size its shader declares, and what every range's first element must
/// be a multiple of (1 but where the kernel derives something from the
/// element's index: a causal softmax's row within its matrix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flat {
    pub elements: u64,
    pub per_invocation: u64,
    pub workgroup: u64,
    pub align: u64,
}

/// One dispatch of a split flat kernel: `count` elements from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub first: u64,
    pub count: u64,
}

/// The ranges a flat kernel of `shape` over bindings `parts` runs in when
/// each split binding may use `windows_each` windows of `window` bytes.
/// Every range starts on a whole invocation and at a byte offset that is a
/// multiple of `unit_bytes` (the device's offset unit, `Gpu::offset_unit`)
/// in every split binding, and each binding's part of
/// it spans at most `windows_each / 2` windows' bytes, so that it takes at
/// most `windows_each` windows even where buffer boundaries cut it (a
/// buffer holds at least one window).
pub fn ranges(
    shape: Flat,
    parts: &[Part],
    window: u64,
    unit_bytes: u64,
    windows_each: u64,
) -> Vec<Range> {
    let unit_bytes = unit_bytes.max(1);
    let mut unit = lcm(shape.per_invocation.max(1), shape.align.max(1));
    let mut widest = 1;
    for p in parts {
        if let Part::Elements(b) = *p {
            let b = b.max(1);
            unit = lcm(unit, unit_bytes / gcd(unit_bytes, b));
            widest = widest.max(b);
        }
    }
    let bytes = (windows_each / 2).max(1) * window;
    let count = (bytes / widest / unit).max(1) * unit;
    let mut out = Vec::new();
    let mut first = 0;
    while first < shape.elements {
        let n = count.min(shape.elements - first);
        out.push(Range { first, count: n });
        first += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_element_once_on_aligned_starts() {
        for (elements, per, parts, window, align, each) in [
            (
                1_000_003u64,
                2u64,
                vec![Part::Elements(2), Part::Elements(4)],
                4096u64,
                256u64,
                4u64,
            ),
            (77, 1, vec![Part::Elements(4), Part::Whole], 256, 256, 2),
            (1 << 20, 4, vec![Part::Elements(4); 3], 1 << 16, 32, 10),
            (5, 2, vec![Part::Elements(2)], 16, 1, 1),
            (1000, 1, vec![Part::Elements(12), Part::Whole], 512, 32, 4),
        ] {
            let shape = Flat {
                elements,
                per_invocation: per,
                workgroup: 256,
                align: if per == 1 { 3 } else { 1 },
            };
            let rs = ranges(shape, &parts, window, lcm(align, 16), each);
            let mut next = 0;
            for r in &rs {
                assert_eq!(r.first, next, "ranges are consecutive");
                assert!(r.count > 0);
                assert_eq!(r.first % per, 0, "a range starts on a whole invocation");
                assert_eq!(r.first % shape.align, 0, "a range starts where asked");
                for p in &parts {
                    if let Part::Elements(b) = p {
                        assert_eq!(r.first * b % lcm(align, 16), 0, "aligned start");
                        if r.first + r.count < elements {
                            assert!(r.count * b <= (each / 2).max(1) * window);
                        }
                    }
                }
                next += r.count;
            }
            assert_eq!(next, elements, "every element in exactly one range");
        }
    }
}
