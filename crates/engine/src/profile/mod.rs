//! Pictures of a recorded run: the memory timeline as SVG and as an
//! interactive self-contained HTML page (in the spirit of PyTorch's
//! memory_viz), a Chrome trace (Perfetto opens it), and the segments and
//! blocks at the peak.

pub mod chrome;
pub mod html;
pub mod op_times;
pub mod series;
pub mod svg;

pub use op_times::OpTimes;
pub use series::{live_at, Series};
