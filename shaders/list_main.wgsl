// The body of a list kernel's main (`#include list_main`, COUNT items):
// item t has whole workgroups, ending at p.ends[t], and p.counts[t]
// elements, PER an invocation (a `const` of the includer), and phase<t>
// runs one invocation of it. A workgroup thus takes one branch: a CPU
// adapter, which runs every side of a divergent branch masked, runs one
// item's code, not all of them.
    let g_ = flat_index(wid, nwg, 0u) / 256u;
    var start_ = 0u;
#for t in 0..COUNT
    let end{{t}}_ = p.ends[{{t/4}}][{{t-t/4*4}}];
    if (g_ < end{{t}}_) {
        let n_ = p.counts[{{t/4}}][{{t-t/4*4}}];
        let at_ = (g_ - start_) * 256u + lidx;
        if (PER * at_ < n_) { phase{{t}}(at_, n_); }
        return;
    }
    start_ = end{{t}}_;
#endfor
