//! Greedy decoding and the logits error measure shared by the model tests.
#![allow(dead_code)]

use shardgraph::models::qwen3::Qwen3Session;

/// Prompt, then greedy decoding of `steps` tokens; returns tokens and the logits of every step.
pub fn generate(s: &mut Qwen3Session, prompt: &[i32], steps: usize) -> (Vec<i32>, Vec<Vec<f32>>) {
    let out = s.decode(prompt, &[], true).unwrap();
    let mut tokens = vec![*out.argmax.last().unwrap()];
    let mut logits = vec![out.logits.unwrap()];
    for _ in 1..steps {
        let o = s.decode(&[*tokens.last().unwrap()], &[], true).unwrap();
        tokens.push(o.argmax[0]);
        logits.push(o.logits.unwrap());
    }
    (tokens, logits)
}

/// Normalised mean squared error of `a` against the reference `b` (ggml's
/// `test-backend-ops` measure): Σ(a−b)² / Σb².
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}
