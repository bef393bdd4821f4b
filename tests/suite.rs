//! Every integration test of the engine and the command line, as modules of
//! one test binary: one link of wgpu instead of one per file (most of a cold
//! CI run was linking). `cargo test --test suite -- kernels::` runs one file's
//! tests; `scripts/test.sh` filters the same way.

mod common;

mod accumulate;
mod amp;
mod autograd;
mod bench_cli;
mod bind_groups;
mod demo_cli;
mod dispatch_batching;
mod docs_examples;
mod doctor_cli;
mod estimate;
mod estimate_differential;
mod found_from_outside;
mod gpt_cli;
mod gpt_ops;
mod gpt_saved;
mod hostile_files;
mod hostile_input;
mod hostile_numerics;
mod kernels;
mod layering;
mod layout;
mod lessons_cli;
mod linear_cross_entropy;
mod low_precision;
mod low_precision_ops;
mod matmul_coop;
mod matmul_family;
mod matmul_tuning;
mod max_batch_cli;
mod ops_backward;
mod ops_reductions;
mod parallel_cli;
mod pickle_reader;
mod profile;
mod pytorch_step;
mod record_cli;
mod recorder_fixtures;
mod replay_cli;
mod resnet_ops;
mod resnet_saved;
mod reuse_fuzz;
mod snapshot_replay;
mod strategies;
mod sweep_cli;
mod torch_amp;
mod torch_fixtures;
mod training_memory;
mod windows;
mod zoo_registry;
