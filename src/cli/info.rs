//! `vramlab info`: adapters, limits, features and the driver's allocator.

use super::args::DeviceArgs;
use crate::device::{Gpu, InfoReport};
use crate::memory::format_size;
use clap::Args;

#[derive(Debug, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InfoArgs) -> anyhow::Result<()> {
    let gpu = Gpu::new(&args.device.options())?;
    let report = InfoReport::from_gpu(&gpu);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("Adapters found:");
    for a in &report.adapters {
        let mark = if a == &report.adapter { "*" } else { " " };
        // GL names no driver, only its version string.
        let driver = [a.driver.as_str(), a.driver_info.as_str()]
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim())
            .collect::<Vec<_>>()
            .join(" ");
        let driver = if driver.is_empty() {
            "not named"
        } else {
            &driver
        };
        println!(
            "  {mark} {} ({}, {}, driver: {driver})",
            a.name, a.backend, a.device_type
        );
    }
    println!();
    println!(
        "Chosen: {} on {}",
        report.adapter.name, report.adapter.backend
    );
    println!("  why: {}", report.choice_reason);
    println!();
    let l = &report.limits;
    println!("Limits that decide what fits:");
    println!(
        "  max_buffer_size                      {:>14}  (larger segments are backed by buffers of {})",
        format_size(l.max_buffer_size),
        format_size(l.buffer_piece)
    );
    println!(
        "  max_storage_buffer_binding_size      {:>14}  (larger tensors are bound in windows of {})",
        format_size(l.max_storage_buffer_binding_size),
        format_size(l.binding_window)
    );
    println!(
        "  max_storage_buffers_per_shader_stage {:>14}  (windows one kernel binds: about {} of tensors at most)",
        l.max_storage_buffers_per_shader_stage,
        format_size(l.largest_dispatch_bytes)
    );
    println!(
        "  min_storage_buffer_offset_alignment  {:>14}  (blocks are 512 B aligned)",
        format!("{} B", l.min_storage_buffer_offset_alignment)
    );
    match l.device_memory_bytes {
        Some(b) => println!(
            "  device memory                        {:>14}  (this CPU adapter's memory is the host's)",
            format_size(b)
        ),
        None => println!(
            "  device memory                        {:>14}  (wgpu does not report a GPU's; its driver says when it is out)",
            "unknown"
        ),
    }
    println!(
        "  largest tensor                       {:>14}  (for every op: memory, and what one reduction binds; elementwise ops, optimizers and products run in parts up to the memory)",
        format_size(l.largest_tensor_bytes)
    );
    println!(
        "  max_compute_workgroup_size           {:>14}",
        format!(
            "{}x{}x{}",
            l.max_compute_workgroup_size_x,
            l.max_compute_workgroup_size_y,
            l.max_compute_workgroup_size_z
        )
    );
    println!(
        "  max_compute_invocations_per_workgroup{:>14}",
        l.max_compute_invocations_per_workgroup
    );
    println!(
        "  max_compute_workgroup_storage_size   {:>14}",
        format_size(l.max_compute_workgroup_storage_size as u64)
    );
    println!(
        "  max_compute_workgroups_per_dimension {:>14}",
        l.max_compute_workgroups_per_dimension
    );
    for note in &report.option_notes {
        println!("  note: {note}");
    }
    println!();
    let has = |f: &str| {
        if report.features.iter().any(|x| x == f) {
            "yes"
        } else {
            "no"
        }
    };
    println!(
        "Features: shader-f16 {}, timestamp-query {}, subgroup {}",
        has("shader-f16"),
        has("timestamp-query"),
        has("subgroup")
    );
    println!(
        "  enabled on vramlab's device: {}",
        report.enabled_features.join(", ")
    );
    println!(
        "  cooperative matrices (tensor cores): {}",
        if report.cooperative_matrices.is_empty() {
            "none offered by this adapter".to_string()
        } else if report.tensor_cores_used {
            format!(
                "{}; f16 products run on them (16×16×16 or else 8×8×8 f16→f32; --no-tensor-cores leaves them unused)",
                report.cooperative_matrices.join(", ")
            )
        } else {
            format!(
                "{}; left unused (they need 16×16×16 or 8×8×8 f16→f32 and native f16, and no --no-tensor-cores)",
                report.cooperative_matrices.join(", ")
            )
        }
    );
    let native_f16 = report.enabled_features.iter().any(|x| x == "shader-f16");
    println!(
        "  tensors: f32; bf16 packed two per word, computed in f32; f16 {}",
        if native_f16 {
            "in WGSL's f16 (SHADER_F16), computed in f32"
        } else {
            "packed two per word and computed in f32 (no SHADER_F16 here: same memory, other speed)"
        }
    );
    println!();
    match &report.driver_allocator {
        Some(d) => println!(
            "Driver allocator: {} allocated in {}, {} reserved ({})",
            format_size(d.total_allocated_bytes),
            super::count(d.blocks as u64, "block"),
            format_size(d.total_reserved_bytes),
            report.driver_allocator_note
        ),
        None => println!("Driver allocator: {}", report.driver_allocator_note),
    }
    Ok(())
}
