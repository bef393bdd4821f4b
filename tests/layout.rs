//! The design's invariant: the allocator (`crates/alloc`), the allocator
//! lab (`crates/lab`) and the parallel layouts (`crates/parallel`) never
//! touch wgpu, so allocator tests, trace replays, snapshot work and
//! per-rank estimates run without a GPU.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn memory_lab_and_parallel_are_free_of_wgpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut files = Vec::new();
    for d in ["alloc/src", "lab/src", "parallel/src"] {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 20, "found {} files", files.len());
    for f in files {
        let s = std::fs::read_to_string(&f).unwrap();
        for (i, line) in s.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !code.contains("wgpu::")
                    && !code.contains("use wgpu")
                    && !code.contains("crate::device"),
                "{}:{}: {line}",
                f.display(),
                i + 1
            );
        }
    }
}
