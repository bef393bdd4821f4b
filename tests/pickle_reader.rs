//! The snapshot pickle reader on real and hostile input: shared references
//! seen filled, and truncations at every offset, byte flips, huge declared
//! lengths, deep nesting and self-containing structures all give errors,
//! never a panic or an allocation the file cannot back.

use std::path::Path;
use vramlab::lab::pickle::{unpickle, PyValue, MAX_DEPTH};

#[test]
fn shared_objects_are_seen_filled() {
    // l = [1, 2]; f = {'filename': 'x.py', 'name': 'f'}
    // pickle.dumps({'a': l, 'b': l, 'frames': [[f, f], [f]]}, protocol=4):
    // `l` and `f` are memoized empty, filled afterwards, and fetched again
    // with BINGET.
    let data = b"\x80\x04\x95P\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94h\x02\x8c\x06frames\x94]\x94(]\x94(}\x94(\x8c\x08filename\x94\x8c\x04x.py\x94\x8c\x04name\x94\x8c\x01f\x94uh\x07e]\x94h\x07aeu.";
    let v = unpickle(data).unwrap();
    let ints = |v: &PyValue| -> Vec<i64> {
        v.as_list()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    assert_eq!(ints(v.get("a").unwrap()), vec![1, 2]);
    assert_eq!(ints(v.get("b").unwrap()), vec![1, 2]);
    let frames = v.get("frames").unwrap().as_list().unwrap();
    for stack in frames {
        for f in stack.as_list().unwrap() {
            assert_eq!(f.get("filename").and_then(PyValue::as_str), Some("x.py"));
        }
    }
    assert_eq!(frames[1].as_list().unwrap().len(), 1);
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/snapshots")
            .join(name),
    )
    .unwrap()
}

#[test]
fn every_truncation_is_an_error_naming_a_byte() {
    let data = fixture("scenario.pickle");
    assert!(unpickle(&data).is_ok());
    for cut in 0..data.len() {
        let e = unpickle(&data[..cut])
            .expect_err("a truncated pickle must not parse")
            .to_string();
        assert!(e.contains("byte"), "cut at {cut}: {e}");
    }
    // A real file, cut at a spread of offsets.
    let real = fixture("ftcourse_memory_snapshot.pickle");
    for k in 0..200 {
        let cut = real.len() * k / 200;
        assert!(unpickle(&real[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn flipped_bytes_never_panic() {
    let data = fixture("scenario.pickle");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..5000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut d = data.clone();
        let at = (state % d.len() as u64) as usize;
        d[at] ^= (state >> 32) as u8 | 1;
        // Either a value or an error; a panic fails the test.
        let _ = unpickle(&d);
    }
}

#[test]
fn huge_declared_lengths_are_refused_before_allocating() {
    // BINUNICODE8 / BINBYTES8 / BINUNICODE / LONG4 claiming far more bytes
    // than the file holds.
    for data in [
        &b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x0fabc."[..],
        &b"\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x80abc."[..],
        &b"\x80\x04X\xff\xff\xff\xffabc."[..],
        &b"\x80\x04\x8b\xff\xff\xff\x7fabc."[..],
        &b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff."[..],
    ] {
        let e = unpickle(data).unwrap_err().to_string();
        assert!(e.contains("declared") || e.contains("left"), "{e}");
    }
}

#[test]
fn deep_nesting_and_cycles_are_errors() {
    // MAX_DEPTH + 10 nested lists: [[[[...]]]]
    let depth = MAX_DEPTH + 10;
    let mut d = b"\x80\x02".to_vec();
    d.extend(std::iter::repeat_n(b']', depth));
    d.extend(std::iter::repeat_n(b'a', depth - 1));
    d.push(b'.');
    let e = unpickle(&d).unwrap_err().to_string();
    assert!(e.contains("nested"), "{e}");
    // Within the limit it parses.
    let mut ok = b"\x80\x02".to_vec();
    ok.extend(std::iter::repeat_n(b']', 100));
    ok.extend(std::iter::repeat_n(b'a', 99));
    ok.push(b'.');
    assert!(unpickle(&ok).is_ok());
    // l = []; l.append(l): a list that contains itself.
    let cyc = b"\x80\x04]\x94h\x00a.";
    let e = unpickle(cyc).unwrap_err().to_string();
    assert!(e.contains("contains itself"), "{e}");
    // Classes and globals are never executed.
    let e = unpickle(b"\x80\x04\x8c\x02os\x8c\x06system\x93.")
        .unwrap_err()
        .to_string();
    assert!(e.contains("0x93"), "{e}");
}
