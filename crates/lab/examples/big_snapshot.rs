//! Writes a PyTorch memory snapshot of any size with the shapes of a real
//! one, streaming (the file is never held in memory), for testing readers
//! on files of 1 GB and more:
//!
//! ```text
//! cargo run --release -p vramlab-lab --example big_snapshot -- OUT.pickle [--mib 1100] [--seed 1]
//! ```
//!
//! The history is a transformer's training steps run through vramlab's
//! PyTorch allocator (its rules, so addresses, segments and the end state
//! are what PyTorch's would be): parameters and AdamW state made once,
//! then per step activations per layer for a sequence length drawn each
//! step (so blocks split and fragment), freed in backward while gradients
//! come and go. As in `cs336_kkaitlyn_ctx128_fullstep.pickle` (167 bytes a
//! trace entry): every allocation carries a new frames list of about 40
//! frames drawn from some 700 shared frame dicts, each free is a
//! `free_requested` and a `free_completed` that share a new list (the
//! stack where the tensor died), each `segment_alloc` has its own,
//! keys and frames are memoized once, and the pickle is protocol 4 with
//! MEMOIZE after every container.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use vramlab_lab::memory::{
    AllocatorConfig, BlockHandle, CachingAllocator, EventKind, MemEvent, SimulatedSource,
};

struct Out<W: Write> {
    w: W,
    memo: u32,
    strings: HashMap<String, u32>,
    written: u64,
}

impl<W: Write> Out<W> {
    fn raw(&mut self, b: &[u8]) {
        self.w.write_all(b).expect("write");
        self.written += b.len() as u64;
    }

    fn memoize(&mut self) -> u32 {
        self.raw(&[0x94]);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, i: u32) {
        if i < 256 {
            self.raw(&[b'h', i as u8]);
        } else {
            let mut b = vec![b'j'];
            b.extend(i.to_le_bytes());
            self.raw(&b);
        }
    }

    fn int(&mut self, i: i64) {
        if (0..256).contains(&i) {
            self.raw(&[b'K', i as u8]);
        } else if (0..65536).contains(&i) {
            let b = (i as u16).to_le_bytes();
            self.raw(&[b'M', b[0], b[1]]);
        } else if i32::try_from(i).is_ok() {
            let mut b = vec![b'J'];
            b.extend((i as i32).to_le_bytes());
            self.raw(&b);
        } else {
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 && bytes[n - 1] == 0 && bytes[n - 2] & 0x80 == 0 {
                n -= 1;
            }
            let mut b = vec![0x8a, n as u8];
            b.extend(&bytes[..n]);
            self.raw(&b);
        }
    }

    fn str(&mut self, s: &str) {
        if let Some(&i) = self.strings.get(s) {
            self.get(i);
            return;
        }
        let mut b = vec![0x8c, s.len() as u8];
        b.extend(s.as_bytes());
        self.raw(&b);
        let i = self.memoize();
        self.strings.insert(s.to_string(), i);
    }

    fn dict_start(&mut self) {
        self.raw(b"}");
        self.memoize();
        self.raw(b"(");
    }

    fn dict_end(&mut self) {
        self.raw(b"u");
    }
}

/// Sites below this make parameters; from `STATE_SITES` on, optimizer
/// state.
const PARAM_SITES: usize = 40;
const STATE_SITES: usize = 360;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// The frame dicts (written once each, then fetched from the memo) and the
/// call stack of each allocation site, innermost first.
struct Frames {
    /// Memo index of each frame dict, once written.
    memo: Vec<Option<u32>>,
    /// (filename, line, function) of each frame.
    frames: Vec<(String, i64, String)>,
    /// Per site: indices into `frames`.
    sites: Vec<Vec<usize>>,
}

impl Frames {
    fn new(rng: &mut Rng, sites: usize) -> Frames {
        let mut frames = Vec::new();
        let torch = [
            "torch/nn/modules/module.py",
            "torch/nn/functional.py",
            "torch/autograd/graph.py",
            "torch/_tensor.py",
            "torch/optim/adamw.py",
            "torch/optim/optimizer.py",
            "torch/utils/_contextlib.py",
        ];
        for i in 0..620 {
            let file = torch[i % torch.len()];
            frames.push((
                format!("/usr/lib/python3/site-packages/{file}"),
                (rng.next(2000) + 1) as i64,
                format!("fn_{i}"),
            ));
        }
        for i in 0..80 {
            frames.push((
                format!("/home/user/project/model/layer_{}.py", i % 12),
                (rng.next(400) + 1) as i64,
                ["forward", "attention", "mlp", "step", "train_step"][i % 5].to_string(),
            ));
        }
        // Where parameters and optimizer state are made, as PyTorch's
        // frames show it (what the reader's categories look for).
        frames.push((
            "/usr/lib/python3/site-packages/torch/nn/modules/linear.py".into(),
            105,
            "reset_parameters".into(),
        ));
        frames.push((
            "/usr/lib/python3/site-packages/torch/optim/adamw.py".into(),
            152,
            "_init_group".into(),
        ));
        let sites = (0..sites)
            .map(|site| {
                let depth = 30 + rng.next(20) as usize;
                let mut s: Vec<usize> = (0..depth - 3).map(|_| rng.next(620) as usize).collect();
                for _ in 0..3 {
                    s.insert(
                        rng.next(s.len() as u64) as usize,
                        620 + rng.next(80) as usize,
                    );
                }
                match site {
                    0..PARAM_SITES => s.insert(1, 700),
                    STATE_SITES.. => s.insert(1, 701),
                    _ => {}
                }
                s
            })
            .collect();
        Frames {
            memo: vec![None; frames.len()],
            frames,
            sites,
        }
    }

    /// Writes a new frames list for `site`; returns its memo index.
    fn write<W: Write>(&mut self, out: &mut Out<W>, site: usize) -> u32 {
        out.raw(b"]");
        let list = out.memoize();
        out.raw(b"(");
        for k in 0..self.sites[site].len() {
            let f = self.sites[site][k];
            match self.memo[f] {
                Some(i) => out.get(i),
                None => {
                    let (file, line, name) = self.frames[f].clone();
                    out.dict_start();
                    self.memo[f] = Some(out.memo - 1);
                    out.str("filename");
                    out.str(&file);
                    out.str("line");
                    out.int(line);
                    out.str("name");
                    out.str(&name);
                    out.dict_end();
                }
            }
        }
        out.raw(b"e");
        list
    }
}

#[derive(Clone, Copy)]
enum Stack {
    Empty,
    Seen(u32),
    New(usize),
}

struct Gen<W: Write> {
    out: Out<W>,
    alloc: CachingAllocator<SimulatedSource>,
    frames: Frames,
    /// Frames list of each live block, by address.
    lists: HashMap<u64, u32>,
    pending: usize,
    t_us: i64,
    entries: u64,
}

impl<W: Write> Gen<W> {
    /// One trace entry; `frames`: an earlier list's memo index, or a site
    /// whose new list is written here (its memo index is returned).
    fn entry(&mut self, action: &str, addr: u64, size: u64, frames: Stack) -> Option<u32> {
        if self.pending == 1000 {
            self.out.raw(b"e(");
            self.pending = 0;
        }
        self.pending += 1;
        self.entries += 1;
        self.t_us += 3;
        let o = &mut self.out;
        o.dict_start();
        o.str("action");
        o.str(action);
        o.str("addr");
        o.int(addr as i64);
        o.str("size");
        o.int(size as i64);
        o.str("stream");
        o.int(0);
        o.str("time_us");
        o.int(self.t_us);
        o.str("frames");
        let list = match frames {
            Stack::Empty => {
                o.raw(b"]");
                None
            }
            Stack::Seen(i) => {
                o.get(i);
                Some(i)
            }
            Stack::New(site) => Some(self.frames.write(&mut self.out, site)),
        };
        self.out.dict_end();
        list
    }

    fn flush_events(&mut self, site: usize) {
        // Taking the log stops it; start it again for the next operation.
        let events: Vec<MemEvent> = self.alloc.take_events();
        self.alloc.start_recording();
        for e in events {
            match e.kind {
                EventKind::SegmentAlloc => {
                    self.entry("segment_alloc", e.address, e.size, Stack::New(site));
                }
                EventKind::SegmentFree => {
                    self.entry("segment_free", e.address, e.size, Stack::Empty);
                }
                EventKind::Alloc => {
                    let size = e.requested.max(1);
                    if let Some(list) = self.entry("alloc", e.address, size, Stack::New(site)) {
                        self.lists.insert(e.address, list);
                    }
                }
                EventKind::Free => {
                    // The free's own stack (where the tensor died), one list
                    // for both of its entries.
                    self.lists.remove(&e.address);
                    let size = e.requested.max(1);
                    let at = Stack::New((site * 7 + 3) % self.frames.sites.len());
                    let list = self.entry("free_requested", e.address, size, at);
                    let seen = list.map_or(Stack::Empty, Stack::Seen);
                    self.entry("free_completed", e.address, size, seen);
                }
                _ => {}
            }
        }
    }

    fn malloc(&mut self, size: u64, site: usize) -> BlockHandle {
        let a = self.alloc.malloc(size, "").expect("unlimited device");
        self.flush_events(site);
        a.handle
    }

    fn free(&mut self, h: BlockHandle, site: usize) {
        self.alloc.free(h).expect("live block");
        self.flush_events(site);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first().filter(|a| !a.starts_with("--")) else {
        eprintln!("usage: big_snapshot OUT.pickle [--mib N (default 1100)] [--seed S]");
        std::process::exit(2);
    };
    let flag = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().expect("a number"))
            .unwrap_or(default)
    };
    let target = flag("--mib", 1100) << 20;
    let mut rng = Rng(flag("--seed", 1));
    let file = std::fs::File::create(path).expect("create the output file");
    let out = Out {
        w: BufWriter::with_capacity(1 << 20, file),
        memo: 0,
        strings: HashMap::new(),
        written: 0,
    };
    let mut alloc = CachingAllocator::new(SimulatedSource::unlimited(), AllocatorConfig::default());
    alloc.start_recording();
    let frames = Frames::new(&mut rng, 400);
    let mut g = Gen {
        out,
        alloc,
        frames,
        lists: HashMap::new(),
        pending: 0,
        t_us: 1_700_000_000_000_000,
        entries: 0,
    };
    // {'segments': ..., 'device_traces': [[entries]], 'allocator_settings': {...}}
    // The trace comes first so the end state is known when `segments` is
    // written; a dict's keys may come in any order.
    g.out.raw(&[0x80, 4]);
    g.out.dict_start();
    g.out.str("device_traces");
    g.out.raw(b"]");
    g.out.memoize();
    g.out.raw(b"]");
    g.out.memoize();
    g.out.raw(b"(");
    let (layers, hidden) = (24u64, 2048u64);
    let mut params = Vec::new();
    for l in 0..layers {
        for k in 0..6 {
            params.push(g.malloc(hidden * hidden * 4 * (1 + k % 3), (l * 6 + k) as usize % 40));
        }
    }
    let mut state = Vec::new();
    let mut step = 0u64;
    while g.out.written < target {
        let seq = 256 + rng.next(1792);
        let mut saved = Vec::new();
        for l in 0..layers {
            for k in 0..5 {
                let size = seq * hidden * (2 + 2 * (k % 3)) + rng.next(4096);
                let site = 40 + ((l * 5 + k) % 200) as usize;
                saved.push((g.malloc(size, site), site));
            }
            for k in 0..4 {
                let tmp = g.malloc(seq * (64 + 512 * k) + 512, 240 + (k as usize));
                g.free(tmp, 240 + (k as usize));
            }
        }
        while let Some((h, site)) = saved.pop() {
            let grad = g.malloc(seq * hidden * 2 + rng.next(8192), 250 + site % 100);
            g.free(h, site);
            g.free(grad, 250 + site % 100);
        }
        if step == 0 {
            for p in 0..params.len() {
                let size = hidden * hidden * 4 * (1 + (p as u64 % 6) % 3);
                state.push(g.malloc(size, 360 + p % 20));
                state.push(g.malloc(size, 380 + p % 20));
            }
        }
        for (i, _) in params.iter().enumerate() {
            let size = hidden * hidden * 4 * (1 + (i as u64 % 6) % 3);
            let grad = g.malloc(size, 350 + i % 10);
            g.free(grad, 350 + i % 10);
        }
        step += 1;
    }
    g.out.raw(b"e");
    g.out.raw(b"a");
    // Segments at the end, every block in address order (gaps as inactive).
    g.out.str("segments");
    g.out.raw(b"]");
    g.out.memoize();
    g.out.raw(b"(");
    let snap = g.alloc.snapshot();
    for seg in &snap.segments {
        let o = &mut g.out;
        o.dict_start();
        o.str("device");
        o.int(0);
        o.str("address");
        o.int(seg.address as i64);
        o.str("total_size");
        o.int(seg.total_size as i64);
        o.str("allocated_size");
        o.int(seg.allocated_size as i64);
        o.str("active_size");
        o.int(seg.active_size as i64);
        o.str("requested_size");
        o.int(seg.requested_size as i64);
        o.str("stream");
        o.int(0);
        o.str("segment_type");
        o.str(seg.segment_type);
        o.str("is_expandable");
        o.raw(&[0x89]);
        o.str("frames");
        o.raw(b"]");
        o.str("blocks");
        o.raw(b"]");
        o.memoize();
        o.raw(b"(");
        for b in &seg.blocks {
            let list = g.lists.get(&b.address).copied();
            let o = &mut g.out;
            o.dict_start();
            o.str("address");
            o.int(b.address as i64);
            o.str("size");
            o.int(b.size as i64);
            o.str("requested_size");
            o.int(b.requested_size as i64);
            o.str("state");
            o.str(b.state);
            o.str("frames");
            match list {
                Some(i) => o.get(i),
                None => o.raw(b"]"),
            }
            o.dict_end();
        }
        g.out.raw(b"e");
        g.out.dict_end();
    }
    g.out.raw(b"e");
    g.out.str("allocator_settings");
    g.out.dict_start();
    g.out.str("PYTORCH_CUDA_ALLOC_CONF");
    g.out.str("");
    g.out.str("max_split_size");
    g.out.int(-1);
    g.out.str("expandable_segments");
    g.out.raw(&[0x89]);
    g.out.dict_end();
    g.out.dict_end();
    g.out.raw(b".");
    g.out.w.flush().expect("flush");
    eprintln!(
        "{path}: {} trace entries, {} steps, {:.1} MiB",
        g.entries,
        step,
        g.out.written as f64 / (1 << 20) as f64
    );
}
