//! Settings read from the environment that take one of a few words, or a
//! whole number: one reading each, so every such setting treats an unset or
//! blank variable as its default and refuses anything else it does not
//! take.

/// `var`'s value among `words` (matched after trimming, case as written):
/// `default` where unset or blank, else `Err` with the value given, for the
/// caller's error to name beside what the setting takes.
pub fn word_setting<T: Copy>(var: &str, words: &[(&str, T)], default: T) -> Result<T, String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => words
            .iter()
            .find(|(w, _)| *w == v.trim())
            .map(|&(_, value)| value)
            .ok_or(v),
        _ => Ok(default),
    }
}

/// `var`'s value as a whole number of at least `min` (after trimming):
/// `default` where unset or blank, else `Err` with the value given.
pub fn number_setting(var: &str, default: usize, min: usize) -> Result<usize, String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(v),
        },
        _ => Ok(default),
    }
}
