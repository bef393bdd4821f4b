//! Growth fits for sweeps: a least-squares line (slope, intercept, R²) and
//! a power law y = a·x^k (k from the line through log x, log y).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fit {
    pub slope: f64,
    pub intercept: f64,
    pub r2: f64,
    /// Exponent of the power fit (NaN when a value is not positive).
    pub exponent: f64,
}

fn line(x: &[f64], y: &[f64]) -> (f64, f64, f64) {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|v| (v - mx).powi(2)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let syy: f64 = y.iter().map(|v| (v - my).powi(2)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let r2 = if sxx > 0.0 && syy > 0.0 {
        sxy * sxy / (sxx * syy)
    } else {
        1.0
    };
    (slope, my - slope * mx, r2)
}

/// Fits `ys` against `xs` (at least two points).
pub fn fit(xs: &[f64], ys: &[f64]) -> Option<Fit> {
    if xs.len() < 2 || xs.len() != ys.len() {
        return None;
    }
    let (slope, intercept, r2) = line(xs, ys);
    let exponent = if xs.iter().chain(ys).all(|v| *v > 0.0) {
        let lx: Vec<f64> = xs.iter().map(|v| v.ln()).collect();
        let ly: Vec<f64> = ys.iter().map(|v| v.ln()).collect();
        line(&lx, &ly).0
    } else {
        f64::NAN
    };
    Some(Fit {
        slope,
        intercept,
        r2,
        exponent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line_and_square() {
        let xs = [1.0, 2.0, 4.0, 8.0];
        let f = fit(&xs, &xs.map(|x| 3.0 * x + 5.0)).unwrap();
        assert!((f.slope - 3.0).abs() < 1e-12 && (f.intercept - 5.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        let g = fit(&xs, &xs.map(|x| 7.0 * x * x)).unwrap();
        assert!((g.exponent - 2.0).abs() < 1e-12);
        assert!(g.r2 < 1.0);
        assert!(fit(&[1.0], &[1.0]).is_none());
    }
}
