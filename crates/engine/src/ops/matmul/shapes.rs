//! A product's shapes: the views of its operands ([`MatView`], [`Gemm`],
//! [`ConvGeometry`]), the shape a model issued ([`GemmShape`]), its class
//! ([`ShapeClass`]) and how its K is split ([`plan_split`]). Everything here
//! depends on shapes only, never on the adapter, so a simulated device
//! allocates exactly what a real one does.

/// Output tiles (counted at 64×64, whatever kernel runs) below which K is
/// split: enough workgroups to fill a GPU's multiprocessors or a CPU's cores.
const TARGET_GROUPS: usize = 128;
/// The shortest K range one split is given.
const MIN_SPLIT_K: usize = 256;

/// The workgroups a split aims at and the shortest K range of one split:
/// [`TARGET_GROUPS`] and [`MIN_SPLIT_K`], or `VRAMLAB_SPLIT_GROUPS` and
/// `VRAMLAB_SPLIT_MIN_K` where set, to time on a GPU whether shorter K
/// ranges (a shorter chain of dependent slices) pay for more partials.
/// Still shapes only: `estimate` reads the same values, so stays exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SplitTargets {
    pub groups: usize,
    pub min_k: usize,
}

impl SplitTargets {
    /// The environment's values, or an error naming the one that is not a
    /// whole number of at least 1.
    pub fn from_env() -> Result<SplitTargets, crate::tensor::ConfigError> {
        Ok(SplitTargets {
            groups: setting("VRAMLAB_SPLIT_GROUPS", TARGET_GROUPS)?,
            min_k: setting("VRAMLAB_SPLIT_MIN_K", MIN_SPLIT_K)?,
        })
    }

    /// The values in effect, read once a process (the CLI refuses bad
    /// values first; for a library user a bad value is that one setting's
    /// default).
    pub fn in_effect() -> SplitTargets {
        static TARGETS: std::sync::OnceLock<SplitTargets> = std::sync::OnceLock::new();
        *TARGETS.get_or_init(|| SplitTargets {
            groups: setting("VRAMLAB_SPLIT_GROUPS", TARGET_GROUPS).unwrap_or(TARGET_GROUPS),
            min_k: setting("VRAMLAB_SPLIT_MIN_K", MIN_SPLIT_K).unwrap_or(MIN_SPLIT_K),
        })
    }
}

/// `var` as a whole number of at least 1, `default` where unset or blank.
fn setting(var: &'static str, default: usize) -> Result<usize, crate::tensor::ConfigError> {
    crate::device::settings::number_setting(var, default, 1).map_err(|value| {
        crate::tensor::ConfigError::Env {
            var,
            value,
            expected: "a whole number of at least 1",
        }
    })
}

/// The most workspace one batch of partial products may take; a larger
/// reduced batch is done in groups that accumulate.
const MAX_PARTIALS_BYTES: usize = 4 << 20;

/// The shape classes the models issue, each with its own tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShapeClass {
    /// Both output sides at least 32.
    Square,
    /// Few output columns (the fc forward: N = 10; conv1's weight gradient: N = 27).
    Narrow,
    /// Few output rows (the fc weight gradient: M = 10).
    Short,
    /// A short reduction (conv1 forward: K = 27; the fc input gradient:
    /// K = 10): little work per output, so many small workgroups.
    Shallow,
}

impl ShapeClass {
    pub fn of(m: usize, n: usize, k: usize) -> ShapeClass {
        if n < 32 && n <= m {
            ShapeClass::Narrow
        } else if m < 32 {
            ShapeClass::Short
        } else if k < 64 {
            ShapeClass::Shallow
        } else {
            ShapeClass::Square
        }
    }
}

/// Where a matrix (or a batch of matrices) sits inside a tensor, in elements:
/// element (b, r, c) is at `offset + b*batch_stride + r*row_stride + c*col_stride`.
/// Strides express transposes; a batch stride of 0 shares one matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatView {
    pub offset: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    pub batch_stride: usize,
}

impl MatView {
    /// A row-major `rows × cols` matrix at `offset`, repeated every
    /// `rows*cols` elements; transposed reading when `transpose`.
    pub fn dense(offset: usize, rows: usize, cols: usize, transpose: bool) -> MatView {
        let (row_stride, col_stride) = if transpose { (1, cols) } else { (cols, 1) };
        MatView {
            offset,
            row_stride,
            col_stride,
            batch_stride: rows * cols,
        }
    }

    pub fn shared(mut self) -> MatView {
        self.batch_stride = 0;
        self
    }
}

/// One general matrix multiply: `C[b] (+)= A[b] · B[b]` for `batch` matrices,
/// A viewed as m×k, B as k×n, C row-major m×n at `c_offset` + b·`c_batch_stride`;
/// or, with `reduce_batch`, `C (+)= Σ_b A[b] · B[b]` (one C).
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: MatView,
    pub b: MatView,
    pub c_offset: usize,
    pub c_batch_stride: usize,
    /// Add to C instead of overwriting it.
    pub accumulate: bool,
    /// Sum the batch's products into one C.
    pub reduce_batch: bool,
    /// B is the im2col of this convolution's input (B's view then gives
    /// only the offset and the per-sample stride).
    pub implicit_b: Option<ConvGeometry>,
}

/// A convolution whose im2col a product reads in place as its B operand
/// (`[C·KH·KW, HO·WO]` per sample): implicit GEMM, no im2col buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ConvGeometry {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
    /// Output width (the output height follows from the column count).
    pub wo: usize,
    /// B is im2colᵀ (positions × rows) rather than im2col.
    pub transposed: bool,
    /// The kernel window is read rotated by 180° (row (c, ky, kx) reads
    /// tap (KH−1−ky, KW−1−kx)): the input gradient as a convolution.
    pub flipped: bool,
}

impl ConvGeometry {
    pub(super) fn params(&self) -> [u32; 8] {
        [
            self.c,
            self.h,
            self.w,
            self.kh,
            self.kw,
            self.stride,
            self.pad,
            self.wo,
        ]
        .map(|v| v as u32)
    }
}

/// A product's shape as a model issued it, for `vramlab bench` to replay:
/// sizes, whether each operand is read transposed or shared across the
/// batch, and the op that issued it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GemmShape {
    pub op: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
    pub a_shared: bool,
    pub b_shared: bool,
    pub reduce_batch: bool,
    /// B read as a convolution's im2col in place.
    pub conv: Option<ConvGeometry>,
}

impl GemmShape {
    pub fn of(g: &Gemm, op: &str) -> GemmShape {
        GemmShape {
            op: op.to_string(),
            m: g.m,
            n: g.n,
            k: g.k,
            batch: g.batch,
            a_transposed: g.a.col_stride != 1 && g.k > 1,
            b_transposed: g.b.col_stride != 1 && g.n > 1,
            a_shared: g.a.batch_stride == 0,
            b_shared: g.b.batch_stride == 0,
            reduce_batch: g.reduce_batch,
            conv: g.implicit_b,
        }
    }

    /// Multiply-adds ×2.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }

    /// The same product as a [`Gemm`] over fresh dense operands.
    pub fn gemm(&self) -> Gemm {
        let mut a = MatView::dense(0, self.m, self.k, false);
        if self.a_transposed {
            a = MatView::dense(0, self.k, self.m, true);
        }
        let mut b = MatView::dense(0, self.k, self.n, false);
        if self.b_transposed {
            b = MatView::dense(0, self.n, self.k, true);
        }
        if self.a_shared {
            a = a.shared();
        }
        if let Some(cv) = self.conv {
            b = MatView {
                offset: 0,
                row_stride: 0,
                col_stride: 0,
                batch_stride: cv.c * cv.h * cv.w,
            };
        }
        if self.b_shared {
            b = b.shared();
        }
        Gemm {
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            a,
            b,
            c_offset: 0,
            c_batch_stride: if self.reduce_batch {
                0
            } else {
                self.m * self.n
            },
            accumulate: false,
            reduce_batch: self.reduce_batch,
            implicit_b: self.conv,
        }
    }

    /// Elements of A, B and C the product touches.
    pub fn sizes(&self) -> (usize, usize, usize) {
        let batches = |shared: bool| if shared { 1 } else { self.batch };
        let c = if self.reduce_batch { 1 } else { self.batch };
        let b = match self.conv {
            Some(cv) => cv.c * cv.h * cv.w,
            None => self.k * self.n,
        };
        (
            batches(self.a_shared) * self.m * self.k,
            batches(self.b_shared) * b,
            c * self.m * self.n,
        )
    }
}

/// How a product is cut: K splits per batch entry, and batch entries per
/// group of partial products (all of them when no workspace is needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Split {
    pub splits: usize,
    pub k_chunk: usize,
    /// Batch entries per workspace group; 0 when no workspace is used.
    pub group: usize,
}

/// The split for `g`: shapes only, never the adapter (so a simulated run
/// allocates the same workspace as a real one).
pub fn plan_split(g: &Gemm) -> Split {
    let tiles = g.m.div_ceil(64) * g.n.div_ceil(64);
    let loop_cap = crate::ops::MAX_LOOP_ITERATIONS;
    let mut splits = 1;
    let target = SplitTargets::in_effect();
    // Every batch entry is its own set of workgroups, reduced or not.
    if tiles * g.batch < target.groups {
        let want = target.groups.div_ceil(tiles * g.batch.max(1));
        splits = want.min(g.k / target.min_k).max(1);
    }
    // llvmpipe ends a loop after 65,535 iterations: bound each split's K.
    splits = splits.max(g.k.div_ceil(loop_cap));
    let k_chunk = g.k.div_ceil(splits).max(1);
    let splits = g.k.div_ceil(k_chunk).max(1);
    let partials = splits > 1 || (g.reduce_batch && g.batch > 1);
    if !partials {
        return Split {
            splits: 1,
            k_chunk,
            group: 0,
        };
    }
    let per_entry = splits * g.m * g.n * 4;
    let group = (MAX_PARTIALS_BYTES / per_entry.max(1)).clamp(1, g.batch.max(1));
    Split {
        splits,
        k_chunk,
        group,
    }
}
