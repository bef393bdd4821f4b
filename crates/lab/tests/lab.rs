//! The lab's integration tests in one binary (no wgpu).

mod exact_planner;
mod expandable;
mod export_settings;
mod granules;
mod segment_map;
mod streaming;
mod timeline;
mod vramlab;
