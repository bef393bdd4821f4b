//! The allocator's integration tests in one binary (no wgpu: it builds and
//! links in seconds).

mod allocator;
mod allocator_props;
