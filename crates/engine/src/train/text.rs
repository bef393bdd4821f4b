//! Character-level text for `train --model gpt`: printable ASCII (32–126)
//! and newline as 96 tokens, so any English text file trains the `tiny`
//! GPT preset (vocab 96) with no tokenizer. Each step draws fresh random
//! windows from the text (seeded), as nanoGPT's `get_batch` does.

use super::batch::Batch;
use crate::nn::init::Rng;
use crate::tensor::{Engine, TensorError};

/// Tokens: printable ASCII and newline.
pub const VOCAB: usize = 96;

/// The text `train --model gpt` uses without `--text`: the Apache License
/// 2.0 (this project's license; 11 KB of English).
pub const DEFAULT_TEXT: &str = include_str!("../../../../data/apache-2.0.txt");

/// A text as tokens.
pub struct CharText {
    pub tokens: Vec<u32>,
    /// Bytes outside printable ASCII and newline, read as spaces.
    pub replaced: usize,
}

/// A byte's token: ' '..='~' → 0..=94, '\n' → 95.
fn token(b: u8) -> Option<u32> {
    match b {
        b' '..=b'~' => Some((b - b' ') as u32),
        b'\n' => Some(95),
        _ => None,
    }
}

/// A token's character.
pub fn char_of(t: u32) -> char {
    match t {
        0..=94 => (b' ' + t as u8) as char,
        _ => '\n',
    }
}

impl CharText {
    /// Tokens of `text`; other bytes (tabs, carriage returns, UTF-8
    /// beyond ASCII) become spaces and are counted.
    pub fn new(text: &[u8]) -> CharText {
        let mut replaced = 0;
        let tokens = text
            .iter()
            .map(|&b| {
                token(b).unwrap_or_else(|| {
                    replaced += 1;
                    0
                })
            })
            .collect();
        CharText { tokens, replaced }
    }

    /// `batch` random windows of `seq` tokens with their next-token labels.
    pub fn batch(
        &self,
        engine: &Engine,
        rng: &mut Rng,
        batch: usize,
        seq: usize,
    ) -> Result<Batch, TensorError> {
        let starts = self.starts(rng, batch, seq)?;
        Batch::token_windows(engine, &self.tokens, &starts, seq, VOCAB)
    }

    /// Where the windows begin: uniform in `0..len - seq`, as nanoGPT's
    /// `torch.randint(len(data) - block_size, …)`, so the last window's
    /// labels end on the text's last token.
    pub fn starts(
        &self,
        rng: &mut Rng,
        batch: usize,
        seq: usize,
    ) -> Result<Vec<usize>, TensorError> {
        let len = self.tokens.len();
        if len <= seq {
            return Err(TensorError::TextTooShort { chars: len, seq });
        }
        let room = (len - seq) as u64;
        // The windows' tokens are built on the host: sizes no device holds
        // (2^62 bytes) or the host cannot are errors, not an abort.
        let shape = vec![batch, seq];
        let tokens = batch
            .checked_mul(seq)
            .filter(|&n| n as u64 <= crate::memory::constants::MAX_BYTES / 4)
            .ok_or_else(|| TensorError::TooLarge {
                op: "text batch",
                shape: shape.clone(),
            })?;
        let mut starts = Vec::new();
        starts
            .try_reserve_exact(batch)
            .map_err(|_| TensorError::HostMemory {
                op: "text batch",
                shape,
                bytes: (tokens as u64).saturating_mul(12),
            })?;
        starts.extend((0..batch).map(|_| rng.below(room) as usize));
        Ok(starts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> CharText {
        CharText::new(&vec![b'a'; len])
    }

    #[test]
    fn windows_start_anywhere_nanogpt_would_and_nowhere_else() {
        let mut rng = Rng::new(7);
        let seq = 5;
        // seq + 1 tokens: one window, at 0, whose labels end on the last.
        assert_eq!(text(seq + 1).starts(&mut rng, 4, seq).unwrap(), [0; 4]);
        // seq + 3 tokens: starts 0, 1 and 2, each drawn.
        let starts = text(seq + 3).starts(&mut rng, 400, seq).unwrap();
        for s in 0..3 {
            assert!(starts.contains(&s), "start {s} never drawn");
        }
        assert!(starts.iter().all(|&s| s + seq < seq + 3));
        // seq tokens leave no next token for the last label.
        let e = text(seq).starts(&mut rng, 1, seq).unwrap_err().to_string();
        assert!(e.contains("at least 6"), "{e}");
    }
}
