//! `vramlab models`: the zoo, each model's default sizes, parameter count and
//! parameter names (PyTorch's state_dict names), counted on the simulated
//! shapes without a GPU.

use crate::memory::mib;
use crate::nn::{ModelSpec, ZooEntry, ZOO};
use clap::Args;

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Also list every parameter's name and shape.
    #[arg(long)]
    pub params: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ModelsArgs) -> anyhow::Result<()> {
    let mut out = Vec::new();
    for &ZooEntry { name, about, .. } in ZOO {
        let spec = ModelSpec::default_for(name).map_err(anyhow::Error::msg)?;
        let params = spec.parameter_shapes();
        // One build on the simulated device gives both.
        let count = crate::nn::spec::count_of(&params);
        out.push((name, about, spec, params, count));
    }
    if args.json {
        let v: Vec<_> = out
            .iter()
            .map(|(name, about, spec, params, count)| {
                let mut v = serde_json::json!({
                    "name": name,
                    "about": about,
                    "default": spec,
                    "input_shape": spec.input_shape(),
                    "classes": spec.classes(),
                    "parameters": count,
                });
                // With --params, as the text: every parameter's name and
                // shape, in named_parameters()'s order (no buffers).
                if args.params {
                    v["parameter_shapes"] = params
                        .iter()
                        .map(|(n, s)| serde_json::json!({"name": n, "shape": s}))
                        .collect::<Vec<_>>()
                        .into();
                }
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for (name, about, spec, params, count) in &out {
        println!("{name:<12} {about}");
        println!(
            "{:<12} default: {}; input {:?} per sample; {} parameters ({:.2} MiB in f32)",
            "",
            spec.describe(),
            spec.input_shape(),
            super::grouped(*count as u64),
            mib(*count as u64 * 4)
        );
        if args.params {
            for (n, s) in params {
                println!("{:<14}{n:<28} {s:?}", "");
            }
        }
        println!();
    }
    println!("Choose one with `vramlab train --model NAME`; sizes with the flags named above.");
    println!("With --load W.safetensors the sizes are read from the weights' shapes.");
    Ok(())
}
