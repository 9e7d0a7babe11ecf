//! Sampling (`shardgraph_models::sampling`, llama.cpp's default chain
//! top-k → top-p → min-p → temperature → dist) and speculative sampling
//! (`speculative::generate_with`):
//!
//! - the sampler's distributions against hand-computed ones, greedy ties,
//!   bad options and rows refused, a seed's draws reproducible;
//! - on a mock target (12 tokens, logits a function of the last two) with a
//!   drafter drawing from its own distributions `q ≠ p`, and with a
//!   deterministic one: over 20000 seeded runs each, the tokens of
//!   speculative sampling have the distribution of plain sampling (Pearson
//!   two-sample chi-square under the 1e-4 critical value), and wrong
//!   acceptance rules fail the same check by far;
//! - the tiny `qwen3` on 2 CPU devices with a random DFlash drafter and a
//!   permutation drafter: a greedy sampler gives `generate`'s tokens and
//!   stats and plain greedy decoding's tokens; sampling through DFlash is
//!   reproducible per seed;
//! - the tiny `qwen3` (random weights) on 1 device, temp 1 and top-k 4, a
//!   drafter drawing from the target's own sharper distribution: 1000
//!   speculative runs against 1000 plain ones, the same chi-square check.
//!
//! Every run is seeded: the statistics are the same on every run (no flakes).
//! `--nocapture` prints them with their bounds.

use shardgraph::GgmlType;
use shardgraph_models::sampling::{Sampler, SamplerParams};
use shardgraph_models::speculative::{generate, generate_with, SpecParams};
use shardgraph_models::step::{Drafter, StepOutput, Target};
use shardgraph_models::types::TensorTypes;

#[path = "common/devices.rs"]
mod devices;
#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

// ---------------------------------------------------------------------------
// The chi-square distribution (for the bounds), checked against table values.

/// ln Γ(x), x > 0 (Lanczos, g = 7, 9 terms; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, &g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized upper incomplete gamma function Q(a, x): the series of
/// P for x < a + 1, the continued fraction (modified Lentz) otherwise.
fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut sum, mut term, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-16 {
                break;
            }
        }
        front * h
    }
}

/// P(χ²_df > x).
fn chi2_sf(x: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, x / 2.0)
}

/// The critical value c with P(χ²_df > c) = alpha (bisection on the
/// decreasing survival function).
fn chi2_critical(df: usize, alpha: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 10.0 * df as f64 + 100.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_sf(mid, df) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The p-value threshold of every distribution check. Each check is a
/// fixed seeded computation (it gives the same statistic on every run), so
/// the threshold sets how unlucky a correct implementation could be once,
/// when the seeds were chosen: 1e-4 per check.
const ALPHA: f64 = 1e-4;

/// Pearson's two-sample chi-square statistic of two histograms over the
/// same categories, and its degrees of freedom: categories with fewer than
/// 10 draws in both samples together (under 5 expected in each) are pooled
/// into one, so the chi-square approximation holds.
fn chi2_two_sample(a: &[u64], b: &[u64]) -> (f64, usize) {
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    let (mut pa, mut pb) = (0u64, 0u64);
    let mut cats: Vec<(u64, u64)> = Vec::new();
    for (&x, &y) in a.iter().zip(b) {
        if x + y < 10 {
            pa += x;
            pb += y;
        } else {
            cats.push((x, y));
        }
    }
    if pa + pb > 0 {
        cats.push((pa, pb));
    }
    let (ka, kb) = ((nb / na).sqrt(), (na / nb).sqrt());
    let stat = cats.iter().map(|&(x, y)| (ka * x as f64 - kb * y as f64).powi(2) / (x + y) as f64).sum();
    (stat, cats.len().saturating_sub(1))
}

/// Checks two histograms have one distribution: prints and returns the
/// statistic, the bound and the p-value; the caller asserts.
fn chi2_report(what: &str, a: &[u64], b: &[u64]) -> (f64, f64) {
    let (stat, df) = chi2_two_sample(a, b);
    let bound = chi2_critical(df.max(1), ALPHA);
    println!(
        "{what}: chi-square {stat:.2}, df {df}, bound {bound:.2} (p = {ALPHA:e}), p-value {:.3e}",
        chi2_sf(stat, df.max(1))
    );
    (stat, bound)
}

#[test]
fn chi_square_quantiles_match_the_tables() {
    // Standard table values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
    for (df, alpha, want) in [
        (1, 0.05, 3.841),
        (2, 0.05, 5.991),
        (10, 0.001, 29.588),
        (1, 1e-4, 15.137),
        (5, 1e-4, 25.745),
        (100, 0.01, 135.807),
    ] {
        let got = chi2_critical(df, alpha);
        assert!((got - want).abs() < 2e-3, "df {df} alpha {alpha}: {got} vs {want}");
    }
    // Q(1/2, x/2) = erfc(sqrt(x/2)) for df 1: 3.841 ↔ 0.05.
    assert!((chi2_sf(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-9);
    // df 2: survival exp(-x/2).
    assert!((chi2_sf(7.0, 2) - (-3.5f64).exp()).abs() < 1e-12);
}

// ---------------------------------------------------------------------------
// The sampler against hand-computed distributions.

fn sampler(temp: f32, top_k: usize, top_p: f32, min_p: f32) -> Sampler {
    Sampler::new(SamplerParams { temp, top_k, top_p, min_p, seed: 1 }).unwrap()
}

fn assert_probs(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() < 2e-6, "{what}: token {i}: {g} vs {w} (all {got:?})");
    }
    let sum: f64 = got.iter().map(|&p| p as f64).sum();
    assert!((sum - 1.0).abs() < 1e-5, "{what}: sum {sum}");
}

/// Logits whose softmax is [0.15, 0.5, 0.05, 0.3] (token 1 the most likely,
/// then 3, 0, 2).
fn four() -> Vec<f32> {
    [0.15f64, 0.5, 0.05, 0.3].iter().map(|p| p.ln() as f32).collect()
}

#[test]
fn sampler_distributions_equal_hand_computed_ones() {
    let e = std::f64::consts::E;
    // Plain softmax at temp 1 (filters off).
    assert_probs(&sampler(1.0, 0, 1.0, 0.0).probs(&four()).unwrap(), &[0.15, 0.5, 0.05, 0.3], "softmax");
    // top-k 2 of [1, 3, 2, 0]: tokens 1 and 2, e^3 : e^2.
    let l = [1.0, 3.0, 2.0, 0.0];
    let p1 = e / (e + 1.0);
    assert_probs(&sampler(1.0, 2, 1.0, 0.0).probs(&l).unwrap(), &[0.0, p1, 1.0 - p1, 0.0], "top-k 2");
    // top-k larger than the vocabulary: all kept.
    let z = 1.0 + e + e * e + e * e * e;
    assert_probs(
        &sampler(1.0, 100, 1.0, 0.0).probs(&l).unwrap(),
        &[e / z, e * e * e / z, e * e / z, 1.0 / z],
        "top-k 100",
    );
    // top-k ties: the lower ids.
    assert_probs(&sampler(1.0, 2, 1.0, 0.0).probs(&[2.0, 2.0, 2.0, 1.0]).unwrap(), &[0.5, 0.5, 0.0, 0.0], "tie");
    // top-p 0.75: 0.5 + 0.3 = 0.8 reaches it -> {1, 3} renormalised.
    assert_probs(&sampler(1.0, 0, 0.75, 0.0).probs(&four()).unwrap(), &[0.0, 0.625, 0.0, 0.375], "top-p 0.75");
    // top-p 0.85: 0.5 + 0.3 + 0.15 = 0.95 -> three tokens / 0.95.
    assert_probs(
        &sampler(1.0, 0, 0.85, 0.0).probs(&four()).unwrap(),
        &[0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95],
        "top-p 0.85",
    );
    // top-p 0.3: the first token alone reaches it (at least one is kept).
    assert_probs(&sampler(1.0, 0, 0.3, 0.0).probs(&four()).unwrap(), &[0.0, 1.0, 0.0, 0.0], "top-p 0.3");
    // min-p 0.25: threshold 0.25 * 0.5 = 0.125 keeps 0.5, 0.3, 0.15.
    assert_probs(
        &sampler(1.0, 0, 1.0, 0.25).probs(&four()).unwrap(),
        &[0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95],
        "min-p 0.25",
    );
    // min-p 0.5: threshold 0.25 keeps 0.5 and 0.3.
    assert_probs(&sampler(1.0, 0, 1.0, 0.5).probs(&four()).unwrap(), &[0.0, 0.625, 0.0, 0.375], "min-p 0.5");
    // min-p 1: the maximum alone.
    assert_probs(&sampler(1.0, 0, 1.0, 1.0).probs(&four()).unwrap(), &[0.0, 1.0, 0.0, 0.0], "min-p 1");
    // Temperature: logits ln [1, 2, 4]: temp 2 -> 1 : √2 : 2, temp 0.5 -> 1 : 4 : 16.
    let l = [0.0, 2f32.ln(), 4f32.ln()];
    let s2 = 2f64.sqrt();
    let z = 3.0 + s2;
    assert_probs(&sampler(2.0, 0, 1.0, 0.0).probs(&l).unwrap(), &[1.0 / z, s2 / z, 2.0 / z], "temp 2");
    assert_probs(&sampler(0.5, 0, 1.0, 0.0).probs(&l).unwrap(), &[1.0 / 21.0, 4.0 / 21.0, 16.0 / 21.0], "temp 0.5");
    // The chain's order (llama.cpp): top-p and min-p see the logits before
    // the temperature. top-p 0.75 keeps {1, 3} from [0.15, 0.5, 0.05, 0.3]
    // and then temp 2 gives √0.5 : √0.3 (temperature first would flatten the
    // distribution to ≈ [0.208, 0.379, 0.12, 0.294], where 0.75 needs 3 tokens).
    let (a, b) = (0.5f64.sqrt(), 0.3f64.sqrt());
    let want = [0.0, a / (a + b), 0.0, b / (a + b)];
    assert_probs(&sampler(2.0, 0, 0.75, 0.0).probs(&four()).unwrap(), &want, "top-p then temp");
    // min-p 0.5 before temp 2 keeps {1, 3} (after temp, 0.15 would pass: √(0.15/0.5) > 0.5).
    assert_probs(&sampler(2.0, 0, 1.0, 0.5).probs(&four()).unwrap(), &want, "min-p then temp");
    // top-k before top-p: top-k 2 leaves [0.625, 0.375], where top-p 0.6
    // keeps the first alone (on the whole row it would keep two).
    assert_probs(&sampler(1.0, 2, 0.6, 0.0).probs(&four()).unwrap(), &[0.0, 1.0, 0.0, 0.0], "top-k then top-p");
    // llama.cpp's defaults at temp 0.8 on [0.15, 0.5, 0.05, 0.3]: top-k 40
    // keeps all, top-p 0.95 needs 0.5 + 0.3 + 0.15 = 0.95 (the boundary is
    // rounding; avoid it: take top-p 0.9), min-p 0.05 keeps >= 0.025 (all
    // three), temp 0.8 -> weights p^1.25.
    let w = [0.15f64.powf(1.25), 0.5f64.powf(1.25), 0.0, 0.3f64.powf(1.25)];
    let z: f64 = w.iter().sum();
    let params = SamplerParams { temp: 0.8, top_p: 0.9, ..SamplerParams::default() };
    assert_probs(
        &Sampler::new(params).unwrap().probs(&four()).unwrap(),
        &w.map(|x| x / z),
        "defaults, temp 0.8, top-p 0.9",
    );
    // -inf logits have probability 0 and are never counted by top-k.
    let l = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
    assert_probs(&sampler(1.0, 1, 1.0, 0.0).probs(&l).unwrap(), &[0.0, 1.0, 0.0, 0.0], "-inf and top-k 1");
    assert_probs(&sampler(1.0, 0, 1.0, 0.0).probs(&l).unwrap(), &[0.0, 0.5, 0.0, 0.5], "-inf");
}

/// top-p on a row over 1024 tokens (the sampler sorts the 256 best first,
/// as llama.cpp) against an independent full sort in f64: the kept set
/// reached inside the 256 and past them.
#[test]
fn top_p_on_a_large_row_equals_a_full_sort() {
    let n = 5000usize;
    // Logits -0.01 * rank, the ranks scattered over the ids.
    let logits: Vec<f32> = (0..n).map(|i| -0.01 * ((i * 2749) % n) as f32).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
    let w: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    let cum = |k: usize| order[..k].iter().map(|&i| w[i] / z).sum::<f64>();
    // top-p halfway between the sums of the 19 and 20 best (inside the
    // 256), of the 299 and 300 best (past them).
    for (kept, temp) in [(20usize, 1.0f32), (300, 1.0), (300, 0.5)] {
        let top_p = ((cum(kept - 1) + cum(kept)) / 2.0) as f32;
        assert!(cum(kept) - cum(kept - 1) > 4e-4, "a step of the sum, far above f32 rounding");
        let zk: f64 = order[..kept].iter().map(|&i| (w[i].ln() / temp as f64).exp()).sum();
        let mut want = vec![0.0f64; n];
        for &i in &order[..kept] {
            want[i] = (w[i].ln() / temp as f64).exp() / zk;
        }
        println!("top-p {top_p} of {n} tokens: {kept} kept");
        let got = sampler(temp, 0, top_p, 0.0).probs(&logits).unwrap();
        assert_eq!(got.iter().filter(|&&p| p > 0.0).count(), kept, "top-p {top_p}");
        assert_probs(&got, &want, &format!("top-p {top_p} temp {temp}"));
    }
}

#[test]
fn greedy_is_the_first_argmax_without_a_draw() {
    let mut g = Sampler::new(SamplerParams::greedy()).unwrap();
    assert!(g.params().is_greedy());
    assert_eq!(SamplerParams::default(), SamplerParams::greedy());
    let d = SamplerParams::default();
    assert_eq!((d.temp, d.top_k, d.top_p, d.min_p, d.seed), (0.0, 40, 0.95, 0.05, 0xFFFF_FFFF));
    assert_eq!(g.sample(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
    assert_eq!(g.sample(&[f32::NEG_INFINITY, -5.0, -5.0]).unwrap(), 1);
    assert_eq!(g.sample(&[0.0, f32::INFINITY, f32::INFINITY]).unwrap(), 1);
    assert_eq!(g.probs(&[1.0, 3.0, 3.0, 2.0]).unwrap(), vec![0.0, 1.0, 0.0, 0.0]);
    // A negative temperature is greedy too (llama.cpp: temp <= 0).
    let mut n = Sampler::new(SamplerParams { temp: -1.0, ..SamplerParams::default() }).unwrap();
    assert_eq!(n.sample(&[0.5, 0.25, 7.0, 7.0]).unwrap(), 2);
    // Greedy sampling draws nothing: the generator is where a fresh one is.
    let mut fresh = Sampler::new(SamplerParams::greedy()).unwrap();
    assert_eq!(g.uniform(), fresh.uniform());
}

#[test]
fn bad_options_and_rows_are_errors() {
    let ok = SamplerParams { temp: 1.0, ..SamplerParams::default() };
    for (p, name) in [
        (SamplerParams { temp: f32::NAN, ..ok }, "temp"),
        (SamplerParams { temp: f32::INFINITY, ..ok }, "temp"),
        (SamplerParams { top_p: 0.0, ..ok }, "top_p"),
        (SamplerParams { top_p: 1.5, ..ok }, "top_p"),
        (SamplerParams { top_p: -0.5, ..ok }, "top_p"),
        (SamplerParams { top_p: f32::NAN, ..ok }, "top_p"),
        (SamplerParams { min_p: -0.1, ..ok }, "min_p"),
        (SamplerParams { min_p: 1.01, ..ok }, "min_p"),
        (SamplerParams { min_p: f32::NAN, ..ok }, "min_p"),
    ] {
        let e = Sampler::new(p).unwrap_err();
        assert!(e.to_string().contains(name), "{p:?}: {e}");
        assert!(p.validate().is_err());
    }
    for p in [
        SamplerParams { top_p: 1.0, min_p: 0.0, ..ok },
        SamplerParams { min_p: 1.0, ..ok },
        SamplerParams { top_k: 0, ..ok },
    ] {
        p.validate().unwrap();
    }
    for mut s in [Sampler::new(ok).unwrap(), Sampler::new(SamplerParams::greedy()).unwrap()] {
        for (l, why) in [
            (vec![], "0 logits"),
            (vec![f32::NEG_INFINITY; 3], "-inf"),
            (vec![0.0, f32::NAN, 1.0], "NaN"),
            (vec![f32::NAN; 2], "NaN"),
        ] {
            let e = s.sample(&l).unwrap_err();
            assert!(e.to_string().contains(why), "{l:?}: {e}");
            assert!(s.probs(&l).is_err());
        }
    }
    let mut s = Sampler::new(ok).unwrap();
    assert!(s.probs(&[0.0, f32::INFINITY]).unwrap_err().to_string().contains("+inf"));
    for (p, why) in [
        (vec![], "empty"),
        (vec![0.5, -0.1], "token 1"),
        (vec![f32::NAN, 0.5], "token 0"),
        (vec![0.5, f32::INFINITY], "token 1"),
        (vec![0.0, 0.0], "sum to 0"),
    ] {
        let e = s.sample_from(&p).unwrap_err();
        assert!(e.to_string().contains(why), "{p:?}: {e}");
    }
}

#[test]
fn a_seed_gives_one_sequence_and_draws_follow_the_distribution() {
    let params = SamplerParams { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 42 };
    let draw = |seed| {
        let mut s = Sampler::new(SamplerParams { seed, ..params }).unwrap();
        (0..64).map(|_| s.sample(&four()).unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
    // uniform() is in [0, 1) and reproducible.
    let mut a = Sampler::new(params).unwrap();
    let mut b = Sampler::new(params).unwrap();
    for _ in 0..1000 {
        let u = a.uniform();
        assert!((0.0..1.0).contains(&u), "{u}");
        assert_eq!(u, b.uniform());
    }
    // Goodness of fit of 40000 draws to the hand-computed [0.15, 0.5, 0.05, 0.3].
    let n = 40_000u64;
    let mut counts = [0u64; 4];
    let mut s = Sampler::new(params).unwrap();
    for _ in 0..n {
        counts[s.sample(&four()).unwrap() as usize] += 1;
    }
    let want = [0.15, 0.5, 0.05, 0.3];
    let stat: f64 = counts.iter().zip(want).map(|(&c, p)| (c as f64 - n as f64 * p).powi(2) / (n as f64 * p)).sum();
    let bound = chi2_critical(3, ALPHA);
    println!("sampler draws {counts:?} of {n}: chi-square {stat:.2}, df 3, bound {bound:.2}");
    assert!(stat < bound, "{counts:?}: {stat} >= {bound}");
    // sample_from never draws a token of weight 0.
    let mut s = Sampler::new(params).unwrap();
    for _ in 0..1000 {
        assert_eq!(s.sample_from(&[0.0, 2.0, 0.0]).unwrap(), 1);
    }
}

// ---------------------------------------------------------------------------
// A mock target and drafters.

/// The mock's vocabulary.
const V: usize = 12;

/// The mock target's logits after `prev2, prev1` (a fixed function with
/// distributions of every shape: flat, peaked, two modes).
fn mock_logits(prev2: i32, prev1: i32) -> Vec<f32> {
    let (a, b) = (prev2 as f32, prev1 as f32);
    (0..V)
        .map(|t| {
            let t = t as f32;
            2.0 * (1.3 * t + 0.7 * b + 0.31 * a + 0.1).sin() + 0.8 * (0.45 * t * (1.0 + 0.1 * a) + b).cos()
        })
        .collect()
}

/// A target whose cache is its token history: the logits after each token
/// are [`mock_logits`] of it and the one before.
#[derive(Default)]
struct Mock {
    hist: Vec<i32>,
}

impl Target for Mock {
    fn n_past(&self) -> i64 {
        self.hist.len() as i64
    }

    fn decode(&mut self, tokens: &[i32], _: &[usize], want_logits: bool) -> shardgraph::Result<StepOutput> {
        let mut out = StepOutput::default();
        let mut logits = Vec::new();
        for &t in tokens {
            let prev = self.hist.last().copied().unwrap_or(-1);
            self.hist.push(t);
            let row = mock_logits(prev, t);
            let mut best = 0;
            for (i, &l) in row.iter().enumerate() {
                if l > row[best] {
                    best = i;
                }
            }
            out.argmax.push(best as i32);
            logits.extend(row);
        }
        out.logits = want_logits.then_some(logits);
        Ok(out)
    }

    fn rollback(&mut self, n_past: i64) -> shardgraph::Result<()> {
        assert!(n_past as usize <= self.hist.len());
        self.hist.truncate(n_past as usize);
        Ok(())
    }
}

/// The drafters' own distribution after `prev`: a bigram model, unlike the
/// target's (`q ≠ p`).
fn draft_q(prev: i32) -> Vec<f32> {
    let l: Vec<f64> = (0..V).map(|t| 1.5 * (0.9 * t as f64 + 1.1 * prev as f64).cos()).collect();
    let m = l.iter().copied().fold(f64::MIN, f64::max);
    let e: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| (x / z) as f32).collect()
}

/// Drafts a chain from [`draft_q`]: drawn with its own generator
/// (`random`), returned with `draft_probs`, or the argmax of each row with
/// no distribution (deterministic).
struct QDrafter {
    rng: Rng,
    random: bool,
    q: Vec<Vec<f32>>,
}

impl QDrafter {
    fn new(seed: u64, random: bool) -> Self {
        QDrafter { rng: Rng::new(seed), random, q: Vec::new() }
    }

    fn chain(&mut self, last: i32, n_max: usize) -> Vec<i32> {
        self.q.clear();
        let mut out = Vec::new();
        let mut prev = last;
        for _ in 0..n_max {
            let q = draft_q(prev);
            let x = if self.random {
                let u = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                let mut cum = 0.0;
                let mut x = V - 1;
                for (i, &w) in q.iter().enumerate() {
                    cum += w as f64;
                    if cum > u {
                        x = i;
                        break;
                    }
                }
                x
            } else {
                (0..V).fold(0, |b, i| if q[i] > q[b] { i } else { b })
            };
            self.q.push(q);
            out.push(x as i32);
            prev = x as i32;
        }
        out
    }
}

impl<T> Drafter<T> for QDrafter {
    fn draft(&mut self, _: &mut T, last: i32, _: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
        Ok(self.chain(last, n_max))
    }

    fn draft_probs(&self) -> Option<Vec<Vec<f32>>> {
        self.random.then(|| self.q.clone())
    }
}

const PROMPT: [i32; 2] = [3, 7];
const N_GEN: usize = 5;
const RUNS: u64 = 20_000;

/// Histograms of generated tokens: token 3 (index 2), token 5 (index 4) and
/// the pair of tokens 2 and 3.
#[derive(Clone)]
struct Hists {
    third: Vec<u64>,
    fifth: Vec<u64>,
    pair: Vec<u64>,
}

impl Hists {
    fn new() -> Self {
        Hists { third: vec![0; V], fifth: vec![0; V], pair: vec![0; V * V] }
    }

    fn add(&mut self, t: &[i32]) {
        assert_eq!(t.len(), N_GEN);
        self.third[t[2] as usize] += 1;
        self.fifth[t[4] as usize] += 1;
        self.pair[t[1] as usize * V + t[2] as usize] += 1;
    }

    /// Prints the three statistics and returns (statistic, bound) of each.
    fn compare(&self, plain: &Hists, what: &str) -> Vec<(f64, f64)> {
        vec![
            chi2_report(&format!("{what}, 3rd token"), &self.third, &plain.third),
            chi2_report(&format!("{what}, 5th token"), &self.fifth, &plain.fifth),
            chi2_report(&format!("{what}, tokens 2 and 3"), &self.pair, &plain.pair),
        ]
    }
}

/// The two sampler settings: plain softmax at temp 1, and filters that
/// zero some of `p` (where the drafter's `q` still puts mass).
fn settings() -> [(&'static str, SamplerParams); 2] {
    [
        ("temp 1", SamplerParams { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }),
        (
            "temp 0.7, top-k 6, top-p 0.9, min-p 0.1",
            SamplerParams { temp: 0.7, top_k: 6, top_p: 0.9, min_p: 0.1, seed: 0 },
        ),
    ]
}

/// A test-local speculative step loop on the mock's logits with a given
/// acceptance rule `accept(p(x), q(x), u)` and residual (`max(0, p − q)`,
/// or `p` itself when `resample_p`), for the wrong rules (and, as a
/// control, the right one). Not the library's loop: that one is tested as
/// it is.
fn rule_loop(params: SamplerParams, run: u64, accept: &dyn Fn(f64, f64, f64) -> bool, resample_p: bool) -> Vec<i32> {
    let mut s = Sampler::new(SamplerParams { seed: run, ..params }).unwrap();
    let mut d = QDrafter::new(run + 7_000_000, true);
    let row = |h: &[i32]| mock_logits(h[h.len() - 2], h[h.len() - 1]);
    let mut hist = PROMPT.to_vec();
    let mut out = vec![s.sample(&row(&hist)).unwrap()];
    hist.push(out[0]);
    while out.len() < N_GEN {
        let drafts = d.chain(*hist.last().unwrap(), 3.min(N_GEN - out.len()));
        let mut next = None;
        for (i, &x) in drafts.iter().enumerate() {
            let p = s.probs(&row(&hist)).unwrap();
            let q = &d.q[i];
            if accept(p[x as usize] as f64, q[x as usize] as f64, s.uniform()) {
                out.push(x);
                hist.push(x);
            } else {
                let r: Vec<f32> =
                    if resample_p { p } else { p.iter().zip(q).map(|(&a, &b)| (a - b).max(0.0)).collect() };
                next = Some(s.sample_from(&r).unwrap());
                break;
            }
        }
        let next = next.unwrap_or_else(|| s.sample(&row(&hist)).unwrap());
        out.push(next);
        hist.push(next);
    }
    out.truncate(N_GEN);
    out
}

#[test]
fn speculative_sampling_keeps_the_targets_distribution() {
    let spec = |params: SamplerParams, n_max: usize, drafter: Option<bool>, seed0: u64| {
        let mut h = Hists::new();
        let mut st = shardgraph_models::speculative::SpecStats::default();
        for run in 0..RUNS {
            let mut s = Sampler::new(SamplerParams { seed: seed0 + run, ..params }).unwrap();
            let mut target = Mock::default();
            let mut d = QDrafter::new(run + 7_000_000, drafter.unwrap_or(false));
            let p = SpecParams { n_max, n_min: 0 };
            let (t, x) = generate_with(&mut target, &mut d, &PROMPT, N_GEN, p, &mut s).unwrap();
            h.add(&t);
            st.drafted += x.drafted;
            st.accepted += x.accepted;
            st.target_steps += x.target_steps;
        }
        (h, st)
    };
    for (name, params) in settings() {
        // Plain sampling: no drafts (other seeds than the speculative runs').
        let (plain, st) = spec(params, 0, None, 1_000_000);
        assert_eq!(st.drafted, 0);
        // The plain runs against hand-rolled plain sampling on the mock's
        // logits (the same seeds): the loop's first token and each step's.
        for run in 0..50 {
            let mut s = Sampler::new(SamplerParams { seed: 1_000_000 + run, ..params }).unwrap();
            let mut h = PROMPT.to_vec();
            for _ in 0..N_GEN {
                let t = s.sample(&mock_logits(h[h.len() - 2], h[h.len() - 1])).unwrap();
                h.push(t);
            }
            let mut s = Sampler::new(SamplerParams { seed: 1_000_000 + run, ..params }).unwrap();
            let mut d = QDrafter::new(0, false);
            let got =
                generate_with(&mut Mock::default(), &mut d, &PROMPT, N_GEN, SpecParams { n_max: 0, n_min: 0 }, &mut s)
                    .unwrap()
                    .0;
            assert_eq!(got, h[2..], "run {run}");
        }
        for (random, dname) in [(true, "drafter q != p (draft_probs)"), (false, "deterministic drafter")] {
            let (h, st) = spec(params, 3, Some(random), 0);
            let what = format!("{name}, {dname}");
            println!(
                "{what}: drafted {}, accepted {} ({:.1}%), target steps {}",
                st.drafted,
                st.accepted,
                100.0 * st.accepted as f64 / st.drafted as f64,
                st.target_steps
            );
            // Drafts are accepted and rejected, and fewer target steps than tokens.
            assert!(st.accepted > st.drafted / 50 && st.accepted < st.drafted, "{what}: {st:?}");
            assert!(st.target_steps < RUNS as usize * (N_GEN - 1), "{what}: {st:?}");
            for (stat, bound) in h.compare(&plain, &what) {
                assert!(stat < bound, "{what}: chi-square {stat} >= {bound}");
            }
        }
    }
}

#[test]
fn wrong_acceptance_rules_fail_the_same_check() {
    let (name, params) = settings()[0];
    let mut plain = Hists::new();
    for run in 0..RUNS {
        let mut s = Sampler::new(SamplerParams { seed: 1_000_000 + run, ..params }).unwrap();
        let mut d = QDrafter::new(0, false);
        let p = SpecParams { n_max: 0, n_min: 0 };
        plain.add(&generate_with(&mut Mock::default(), &mut d, &PROMPT, N_GEN, p, &mut s).unwrap().0);
    }
    let hist = |accept: &dyn Fn(f64, f64, f64) -> bool, resample_p: bool| {
        let mut h = Hists::new();
        for run in 0..RUNS {
            h.add(&rule_loop(params, run, accept, resample_p));
        }
        h
    };
    // Control: the right rule in the test's loop passes (the loop is sound).
    let right = hist(&|p, q, u| u * q < p, false);
    for (stat, bound) in right.compare(&plain, &format!("{name}, control: the right rule in the test's loop")) {
        assert!(stat < bound, "control: {stat} >= {bound}");
    }
    // Always accepting the drafts: the tokens follow q.
    let always = hist(&|_, _, _| true, false);
    let stats = always.compare(&plain, &format!("{name}, WRONG: always accept"));
    assert!(stats.iter().all(|&(stat, bound)| stat > 3.0 * bound), "{stats:?}");
    assert!(stats.iter().any(|&(stat, bound)| stat > 30.0 * bound), "{stats:?}");
    // The right acceptance but a rejected draft redrawn from p instead of
    // the residual max(0, p - q): too little mass where q > p.
    let redraw = hist(&|p, q, u| u * q < p, true);
    let stats = redraw.compare(&plain, &format!("{name}, WRONG: redraw from p after a rejection"));
    assert!(stats.iter().any(|&(stat, bound)| stat > 3.0 * bound), "{stats:?}");
    // Accepting with probability p(x) (as if q were one-hot) for drafts drawn from q.
    let onehot = hist(&|p, _, u| u < p, false);
    let stats = onehot.compare(&plain, &format!("{name}, WRONG: one-hot rule for drafts drawn from q"));
    assert!(stats.iter().any(|&(stat, bound)| stat > 3.0 * bound), "{stats:?}");
}

#[test]
fn drafter_distributions_are_checked() {
    /// Drafts token 2 with a given q row.
    struct Bad(Vec<Vec<f32>>, Vec<i32>);
    impl Drafter<Mock> for Bad {
        fn draft(&mut self, _: &mut Mock, _: i32, _: i64, _: usize) -> shardgraph::Result<Vec<i32>> {
            Ok(self.1.clone())
        }
        fn draft_probs(&self) -> Option<Vec<Vec<f32>>> {
            Some(self.0.clone())
        }
    }
    let params = SamplerParams { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 5 };
    let one = |i: usize| {
        let mut r = vec![0.0; V];
        r[i] = 1.0;
        r
    };
    for (q, drafts, why) in [
        (vec![], vec![2], "0 q rows for 1 drafts"),
        (vec![vec![1.0; 3]], vec![2], "3 entries, not 12"),
        (vec![one(5)], vec![2], "probability 0"),
        (
            vec![{
                let mut r = one(2);
                r[7] = f32::NAN;
                r
            }],
            vec![2],
            "token 7",
        ),
        (vec![one(2)], vec![40], "outside the vocabulary"),
    ] {
        let mut s = Sampler::new(params).unwrap();
        let sp = SpecParams { n_max: 2, n_min: 0 };
        let e = generate_with(&mut Mock::default(), &mut Bad(q, drafts), &PROMPT, 4, sp, &mut s).unwrap_err();
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
    // A greedy sampler never reads draft_probs (greedy needs no q).
    let mut g = Sampler::new(SamplerParams::greedy()).unwrap();
    let sp = SpecParams { n_max: 2, n_min: 0 };
    let (t, _) = generate_with(&mut Mock::default(), &mut Bad(vec![], vec![2]), &PROMPT, 4, sp, &mut g).unwrap();
    let mut d = QDrafter::new(0, false);
    let want = generate(&mut Mock::default(), &mut d, &PROMPT, 4, SpecParams { n_max: 0, n_min: 0 }).unwrap().0;
    assert_eq!(t, want);

    // A one-token prompt (no first batch) samples as by hand.
    let mut s = Sampler::new(params).unwrap();
    let mut d = QDrafter::new(0, false);
    let sp = SpecParams { n_max: 0, n_min: 0 };
    let got = generate_with(&mut Mock::default(), &mut d, &[5], 4, sp, &mut s).unwrap().0;
    let mut s = Sampler::new(params).unwrap();
    let mut h = vec![-1, 5];
    for _ in 0..4 {
        let t = s.sample(&mock_logits(h[h.len() - 2], h[h.len() - 1])).unwrap();
        h.push(t);
    }
    assert_eq!(got, h[2..]);

    /// A target returning no logits, or too few.
    struct Short(Mock, usize);
    impl Target for Short {
        fn n_past(&self) -> i64 {
            self.0.n_past()
        }
        fn decode(&mut self, t: &[i32], taps: &[usize], w: bool) -> shardgraph::Result<StepOutput> {
            let mut out = self.0.decode(t, taps, w)?;
            if let Some(l) = out.logits.as_mut() {
                l.truncate(l.len().saturating_sub(self.1));
            }
            if self.1 == usize::MAX {
                out.logits = None;
            }
            Ok(out)
        }
        fn rollback(&mut self, n: i64) -> shardgraph::Result<()> {
            self.0.rollback(n)
        }
    }
    for (cut, why) in [(1, "returned 35 logits for a batch of 3 (n_vocab 11)"), (usize::MAX, "no logits")] {
        let mut s = Sampler::new(params).unwrap();
        let mut d = QDrafter::new(0, true);
        let sp = SpecParams { n_max: 2, n_min: 0 };
        let e = generate_with(&mut Short(Mock::default(), cut), &mut d, &PROMPT, 4, sp, &mut s).unwrap_err();
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
}

// ---------------------------------------------------------------------------
// The tiny qwen3.

use shardgraph_models::dflash::DflashDrafter;
use shardgraph_models::generate::{write_dflash_gguf, write_qwen3_gguf_with, Weights};
use shardgraph_models::qwen3::Qwen3Session;

/// tests/speculative.rs's tiny target (2 layers, E 128, vocabulary 200).
#[path = "common/spec_models.rs"]
mod spec_models;
use spec_models::{dflash_hp, plain_greedy, qwen3_hp as tiny_hp};

/// A scratch directory removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("shardgraph-sampling-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn greedy_sampler_keeps_the_greedy_loop_on_two_devices() {
    let dir = Dir::new("greedy");
    let target = dir.0.join("target.gguf");
    let kind = Weights::PermutationWithAttention { attention: 2.0 };
    write_qwen3_gguf_with(&target, &tiny_hp(), &TensorTypes::uniform(GgmlType::Q8_0), 13, kind).unwrap();
    let dhp = dflash_hp();
    let drafter = dir.0.join("drafter.gguf");
    write_dflash_gguf(&drafter, &dhp, &TensorTypes::uniform(GgmlType::Q8_0), tiny_hp().n_vocab, 17).unwrap();
    let prompt = [3, 14, 15, 92, 65];
    let n_gen = 16;
    let sp = SpecParams { n_max: 4, n_min: 1 };
    let want = plain_greedy(
        &mut Qwen3Session::load(&target, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap(),
        &prompt,
        n_gen,
    );
    let run = |sampler: Option<SamplerParams>| {
        let mut s = Qwen3Session::load(&target, &devices::cpu(&[1.0, 1.0]), GgmlType::F16, 64).unwrap();
        let mut d = DflashDrafter::attach_gguf(&mut s, &drafter, GgmlType::F16, 0.0).unwrap();
        match sampler {
            None => generate(&mut s, &mut d, &prompt, n_gen, sp).unwrap(),
            Some(p) => generate_with(&mut s, &mut d, &prompt, n_gen, sp, &mut Sampler::new(p).unwrap()).unwrap(),
        }
    };
    let greedy = [
        SamplerParams::greedy(),
        SamplerParams { temp: 0.0, top_k: 3, top_p: 0.5, min_p: 0.2, seed: 99 },
        SamplerParams { temp: -2.0, ..SamplerParams::default() },
    ];
    let (tokens, st) = run(None);
    println!("greedy on 2 devices, DFlash drafter: {st:?}");
    assert_eq!(tokens, want, "generate vs plain greedy: {st:?}");
    assert!(st.drafted > 0, "{st:?}");
    for p in greedy {
        let (t, s2) = run(Some(p));
        assert_eq!(t, want, "{p:?}: {s2:?}");
        assert_eq!(s2, st, "{p:?}");
    }
    // A drafter that follows the permutation: accepted where the target's
    // attention does not intervene, rejected where it does.
    struct Chain(Vec<i64>);
    impl Drafter<Qwen3Session> for Chain {
        fn draft(&mut self, _: &mut Qwen3Session, last: i32, _: i64, n: usize) -> shardgraph::Result<Vec<i32>> {
            let mut t = last as i64;
            Ok((0..n)
                .map(|_| {
                    t = self.0[t as usize];
                    t as i32
                })
                .collect())
        }
    }
    let perm = shardgraph_models::generate::permutation(tiny_hp().n_vocab, 13);
    let mut s = Qwen3Session::load(&target, &devices::cpu(&[1.0, 1.0]), GgmlType::F16, 64).unwrap();
    let (tokens, st) = generate(&mut s, &mut Chain(perm.clone()), &prompt, n_gen, sp).unwrap();
    println!("greedy on 2 devices, permutation drafter: {st:?}");
    assert_eq!(tokens, want, "{st:?}");
    assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}");
    for p in greedy {
        let mut s = Qwen3Session::load(&target, &devices::cpu(&[1.0, 1.0]), GgmlType::F16, 64).unwrap();
        let mut sm = Sampler::new(p).unwrap();
        let (t, s2) = generate_with(&mut s, &mut Chain(perm.clone()), &prompt, n_gen, sp, &mut sm).unwrap();
        assert_eq!((t, s2), (want.clone(), st), "{p:?}");
    }
    // Sampling through the same drafter (deterministic: one-hot q): a seed
    // gives one output, another seed another.
    let hot = SamplerParams { temp: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 7 };
    let (a, sa) = run(Some(hot));
    let (b, _) = run(Some(hot));
    let (c, _) = run(Some(SamplerParams { seed: 8, ..hot }));
    println!("temp 1.5 on 2 devices, DFlash drafter: {sa:?}");
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|&t| (0..200).contains(&t)) && a.len() == n_gen);
}

/// A drafter that drafts with the target itself: each draft drawn (its own
/// generator) from the target's top-4 at temperature 0.5 (`q`, sharper
/// than the sampler's `p`), the target rolled back afterwards.
struct SelfDrafter {
    rng: Rng,
    q: Vec<Vec<f32>>,
}

impl Drafter<Qwen3Session> for SelfDrafter {
    fn draft(&mut self, s: &mut Qwen3Session, last: i32, pos: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
        let sharp = Sampler::new(SamplerParams { temp: 0.5, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 })?;
        self.q.clear();
        let mut out = Vec::new();
        let mut t = last;
        for _ in 0..n_max {
            let logits = s.decode(&[t], &[], true)?.logits.unwrap();
            let q = sharp.probs(&logits)?;
            let u = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            let mut cum = 0.0;
            t = q.iter().rposition(|&w| w > 0.0).unwrap() as i32;
            for (i, &w) in q.iter().enumerate() {
                cum += w as f64;
                if w > 0.0 && cum > u {
                    t = i as i32;
                    break;
                }
            }
            self.q.push(q);
            out.push(t);
        }
        s.rollback(pos)?;
        Ok(out)
    }

    fn draft_probs(&self) -> Option<Vec<Vec<f32>>> {
        Some(self.q.clone())
    }
}

/// On the tiny qwen3 (random weights: spread distributions) on one device,
/// temperature 1 and top-k 4: speculative sampling with a drafter of
/// distribution q ≠ p against plain sampling, 1000 seeded runs each (one
/// session reused, rolled back to 0 between runs). Fewer runs than the
/// mock's (a run takes milliseconds): the check has less power, and the
/// mock carries the strict test.
#[test]
fn speculative_sampling_on_the_tiny_qwen3_keeps_its_distribution() {
    let dir = Dir::new("dist");
    let target = dir.0.join("target.gguf");
    write_qwen3_gguf_with(&target, &tiny_hp(), &TensorTypes::uniform(GgmlType::Q8_0), 29, Weights::Random).unwrap();
    let mut s = Qwen3Session::load(&target, &devices::cpu(&[1.0]), GgmlType::F16, 32).unwrap();
    let prompt = [5, 77, 123, 9];
    let (n_gen, runs, v) = (3, 1000u64, 200usize);
    let params = SamplerParams { temp: 1.0, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 };
    let mut hist = |n_max: usize, seed0: u64| {
        let (mut second, mut third) = (vec![0u64; v], vec![0u64; v]);
        let mut st = shardgraph_models::speculative::SpecStats::default();
        for run in 0..runs {
            s.rollback(0).unwrap();
            let mut sm = Sampler::new(SamplerParams { seed: seed0 + run, ..params }).unwrap();
            let mut d = SelfDrafter { rng: Rng::new(seed0 + run + 5_000_000), q: Vec::new() };
            let sp = SpecParams { n_max, n_min: 0 };
            let (t, x) = generate_with(&mut s, &mut d, &prompt, n_gen, sp, &mut sm).unwrap();
            second[t[1] as usize] += 1;
            third[t[2] as usize] += 1;
            st.drafted += x.drafted;
            st.accepted += x.accepted;
        }
        (second, third, st)
    };
    let (p2, p3, _) = hist(0, 1_000_000);
    let (s2, s3, st) = hist(2, 0);
    println!(
        "tiny qwen3, temp 1, top-k 4: drafted {}, accepted {} ({:.1}%)",
        st.drafted,
        st.accepted,
        100.0 * st.accepted as f64 / st.drafted as f64
    );
    assert!(st.accepted > st.drafted / 4 && st.accepted < st.drafted, "{st:?}");
    for (what, a, b) in [("2nd token", &s2, &p2), ("3rd token", &s3, &p3)] {
        let (stat, bound) = chi2_report(&format!("tiny qwen3, temp 1, top-k 4, {what}"), a, b);
        assert!(stat < bound, "{what}: {stat} >= {bound}");
    }
}
