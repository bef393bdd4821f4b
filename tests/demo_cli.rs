//! `vramlab demo --json`: what is live at the peak, by category, adds up to
//! the peak measured on the GPU (within two blocks), and backward's temporaries — the line the
//! article's hand count lacks — are what separates it from the article's
//! 55.73 MiB (issue 15's fix of the demo's explanation).

mod common;

#[test]
fn demo_explains_its_peak_by_category() {
    let v = common::vramlab_json(["demo", "--batch", "16", "--steps", "2", "--json"]);
    let at_peak = v["at_peak_by_category_bytes"].as_object().unwrap();
    let sum: u64 = at_peak.values().map(|b| b.as_u64().unwrap()).sum();
    let steps = v["steps"].as_array().unwrap();
    let measured_peak = steps.last().unwrap()["peak_allocated_bytes"]
        .as_u64()
        .unwrap();
    // The simulated step is the Trainer's; the demo writes its step out as
    // the article does, which may differ by a block or two (≤ 2 KiB).
    assert!(
        sum.abs_diff(measured_peak) <= 2048,
        "{sum} vs {measured_peak}: {at_peak:?}"
    );
    let temporary = at_peak["temporary"].as_u64().unwrap();
    let activation = at_peak["activation"].as_u64().unwrap();
    assert!(temporary > 0 && activation > 0);
    // Step 2's peak holds Adam's state: two f32 copies of the parameters,
    // each of the 6 tensors' blocks rounded up to 512 B.
    let params = v["parameters"].as_u64().unwrap();
    let state = at_peak["optimizer_state"].as_u64().unwrap();
    assert!(
        (8 * params..8 * params + 12 * 512).contains(&state),
        "{state}"
    );
}
