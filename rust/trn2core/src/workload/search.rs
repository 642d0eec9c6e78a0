//! Ranking parallel layouts of a [`Model`] on a machine: every combination of the degrees the
//! caller allows is estimated through [`prefill`]/[`decode`] (or [`train_step`]), the ones that
//! do not fit or do not divide the model are skipped and counted, and the rest are sorted by
//! the objective (docs/workload.md, "Search").

use super::inference::{decode, doublings, prefill, Layout, Machine};
use super::model::Model;
use super::training::{train_step, Recompute, TrainLayout};
use crate::numerics::Format;
use crate::spec::CORES_PER_CHIP;
use crate::{Error, Result};

/// What the layouts are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Time to first token (lowest first).
    Ttft,
    /// Inter-token latency (time per output token, lowest first).
    Itl,
    /// Tokens per second over the machine (highest first).
    Throughput,
    /// Cost per million tokens at the caller's price per instance-hour (lowest first).
    Cost,
}

impl Objective {
    /// `"ttft"`, `"itl"`, `"throughput"` or `"cost"`; `ValueError` on `objective` otherwise.
    pub fn named(name: &str) -> Result<Objective> {
        match name {
            "ttft" => Ok(Objective::Ttft),
            "itl" => Ok(Objective::Itl),
            "throughput" => Ok(Objective::Throughput),
            "cost" => Ok(Objective::Cost),
            _ => Err(Error::value(
                "objective",
                format!("{name:?}: expected \"ttft\", \"itl\", \"throughput\" or \"cost\""),
            )),
        }
    }
}

/// The degrees to try (an empty list: the defaults) and the request's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchSpace {
    /// Machine.
    pub machine: Machine,
    /// Objective.
    pub objective: Objective,
    /// Price of the machine per hour (needed for [`Objective::Cost`]).
    pub price_per_hour: Option<f64>,
    /// Rank training layouts instead of inference ones.
    pub train: bool,
    /// Prompt tokens (inference).
    pub prompt: u64,
    /// Output tokens (inference).
    pub output: u64,
    /// Tensor-parallel degrees (default: powers of two up to the machine's logical cores).
    pub tp: Vec<usize>,
    /// Pipeline-parallel degrees (training; default: powers of two up to 16).
    pub pp: Vec<usize>,
    /// Expert-parallel degrees (default: powers of two dividing the experts and TP).
    pub ep: Vec<usize>,
    /// LNC (default: 1 and 2).
    pub lnc: Vec<usize>,
    /// Sequences per step (inference) or per micro-batch (training); default 1, 4, 16, 64
    /// (training: 1, 2, 4).
    pub batch: Vec<u64>,
    /// GEMM/weight format.
    pub dtype: Format,
    /// Training: sequences per step over all replicas.
    pub global_batch: u64,
    /// Training: tokens per sequence.
    pub seq: u64,
    /// Layouts slower than this time to first token are dropped (seconds).
    pub max_ttft_s: Option<f64>,
    /// Layouts slower than this inter-token latency are dropped (seconds).
    pub max_itl_s: Option<f64>,
}

/// One ranked layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Pipeline-parallel degree (1 for inference).
    pub pp: usize,
    /// Data-parallel degree: model replicas on the machine.
    pub dp: usize,
    /// Expert-parallel degree.
    pub ep: usize,
    /// LNC.
    pub lnc: usize,
    /// Sequences per step (inference) or per micro-batch (training).
    pub batch: u64,
    /// Time to first token (inference; 0 for training).
    pub ttft_s: f64,
    /// Inter-token latency (inference), or the step time (training).
    pub itl_s: f64,
    /// Tokens per second over the machine (output tokens for inference, trained for training).
    pub tokens_per_s: f64,
    /// Cost per million tokens, with a price.
    pub cost_per_mtok: Option<f64>,
    /// MFU (training; 0 for inference).
    pub mfu: f64,
    /// The objective's value (lower ranks first; throughput negated).
    pub score: f64,
}

/// The ranked layouts and what was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// Layouts that fit, best first.
    pub layouts: Vec<Candidate>,
    /// Layouts tried.
    pub tried: usize,
    /// Layouts whose memory plan did not fit (`CapacityError`).
    pub skipped_capacity: usize,
    /// Layouts the model or machine does not allow (degrees that do not divide).
    pub skipped_invalid: usize,
    /// Layouts that fit but missed `max_ttft_s` / `max_itl_s`.
    pub skipped_constraints: usize,
}

fn powers_of_two(max: usize) -> Vec<usize> {
    doublings(1).take_while(|&x| x <= max as u64).map(|x| x as usize).collect()
}

fn or_default<T: Clone>(given: &[T], default: Vec<T>) -> Vec<T> {
    if given.is_empty() {
        default
    } else {
        given.to_vec()
    }
}

/// Ranks the layouts of `space` for `model`. `ValueError` on an objective that needs a price
/// it was not given, or a training objective that is a latency.
pub fn search(model: &Model, space: &SearchSpace) -> Result<SearchResult> {
    if space.objective == Objective::Cost {
        match space.price_per_hour {
            Some(p) if p.is_finite() && p > 0.0 => {}
            _ => {
                return Err(Error::value(
                    "price_per_hour",
                    "objective \"cost\" needs a positive price per instance-hour",
                ))
            }
        }
    }
    if space.train && matches!(space.objective, Objective::Ttft | Objective::Itl) {
        return Err(Error::value(
            "objective",
            "training layouts rank by \"throughput\" or \"cost\"",
        ));
    }
    if space.prompt == 0 || space.output == 0 {
        return Err(Error::value(
            if space.prompt == 0 { "prompt" } else { "output" },
            "must be at least 1",
        ));
    }
    let lncs = or_default(&space.lnc, vec![1, 2]);
    let max_cores = space.machine.chips.saturating_mul(CORES_PER_CHIP);
    let tps = or_default(&space.tp, powers_of_two(max_cores));
    let experts = model.moe.map(|m| m.experts);
    let mut res = SearchResult {
        layouts: Vec::new(),
        tried: 0,
        skipped_capacity: 0,
        skipped_invalid: 0,
        skipped_constraints: 0,
    };
    let price_per_s = space.price_per_hour.map(|p| p / 3600.0);
    let record = |res: &mut SearchResult, r: Result<Candidate>| match r {
        Ok(c) => {
            let over_ttft = space.max_ttft_s.is_some_and(|m| !space.train && c.ttft_s > m);
            let over_itl = space.max_itl_s.is_some_and(|m| !space.train && c.itl_s > m);
            if over_ttft || over_itl {
                res.skipped_constraints += 1;
            } else {
                res.layouts.push(c);
            }
        }
        Err(Error::Capacity { .. }) => res.skipped_capacity += 1,
        Err(_) => res.skipped_invalid += 1,
    };
    for &lnc in &lncs {
        let ranks = space.machine.chips.saturating_mul(CORES_PER_CHIP / lnc.max(1));
        for &tp in &tps {
            let eps = match experts {
                None => vec![1],
                Some(e) => or_default(
                    &space.ep,
                    powers_of_two(tp).into_iter().filter(|&x| e.is_multiple_of(x as u64)).collect(),
                ),
            };
            for &ep in &eps {
                if space.train {
                    let pps = or_default(&space.pp, powers_of_two(16));
                    let batches = or_default(&space.batch, vec![1, 2, 4]);
                    for &pp in &pps {
                        let group = tp.saturating_mul(pp);
                        if group == 0 || group > ranks {
                            continue;
                        }
                        let dp = ranks / group;
                        for &mb in &batches {
                            res.tried += 1;
                            let t = TrainLayout {
                                machine: space.machine.clone(),
                                tp,
                                pp,
                                dp,
                                ep,
                                lnc,
                                micro_batch: mb,
                                global_batch: space.global_batch,
                                seq: space.seq,
                                dtype: space.dtype,
                                zero1: true,
                                recompute: Recompute::Full,
                                sequence_parallel: true,
                            };
                            let r = train_step(model, &t).map(|r| {
                                let cost = price_per_s.map(|p| {
                                    p * r.seconds * 1e6 / {
                                        (space.global_batch as f64) * space.seq as f64
                                    }
                                });
                                Candidate {
                                    tp,
                                    pp,
                                    dp,
                                    ep,
                                    lnc,
                                    batch: mb,
                                    ttft_s: 0.0,
                                    itl_s: r.seconds,
                                    tokens_per_s: r.tokens_per_s,
                                    cost_per_mtok: cost,
                                    mfu: r.mfu,
                                    score: match space.objective {
                                        Objective::Cost => cost.unwrap_or(f64::INFINITY),
                                        _ => -r.tokens_per_s,
                                    },
                                }
                            });
                            record(&mut res, r);
                        }
                    }
                    continue;
                }
                let batches = or_default(&space.batch, vec![1, 4, 16, 64]);
                for &batch in &batches {
                    res.tried += 1;
                    let seq_len = space.prompt.saturating_add(space.output).max(128);
                    let machine = space.machine.clone();
                    let l = Layout::native(machine, tp, ep, lnc, batch, space.dtype, seq_len);
                    let r = (|| {
                        let p = prefill(model, &l, space.prompt)?;
                        let d = decode(model, &l, space.prompt + space.output / 2)?;
                        // Replicas of the model serve side by side (data parallelism).
                        let dp = (ranks / tp).max(1);
                        let tokens_per_s = (batch as f64) * dp as f64 / d.seconds;
                        let cost = price_per_s.map(|p| p * 1e6 / tokens_per_s);
                        Ok(Candidate {
                            tp,
                            pp: 1,
                            dp,
                            ep,
                            lnc,
                            batch,
                            ttft_s: p.seconds,
                            itl_s: d.seconds,
                            tokens_per_s,
                            cost_per_mtok: cost,
                            mfu: 0.0,
                            score: match space.objective {
                                Objective::Ttft => p.seconds,
                                Objective::Itl => d.seconds,
                                Objective::Throughput => -tokens_per_s,
                                Objective::Cost => cost.unwrap_or(f64::INFINITY),
                            },
                        })
                    })();
                    record(&mut res, r);
                }
            }
        }
    }
    res.layouts.sort_by(|a, b| a.score.total_cmp(&b.score));
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::arg_of;

    fn space(objective: Objective) -> SearchSpace {
        SearchSpace {
            machine: Machine::named("trn2.48xlarge").expect("machine"),
            objective,
            price_per_hour: None,
            train: false,
            prompt: 1024,
            output: 256,
            tp: Vec::new(),
            pp: Vec::new(),
            ep: Vec::new(),
            lnc: Vec::new(),
            batch: Vec::new(),
            dtype: Format::Bf16,
            global_batch: 64,
            seq: 4096,
            max_ttft_s: None,
            max_itl_s: None,
        }
    }

    #[test]
    fn the_best_itl_is_no_slower_than_any_layout_and_misfits_are_counted() {
        let m = Model::preset("llama-3.3-70b").expect("preset");
        let r = search(&m, &space(Objective::Itl)).expect("search");
        // 2 LNCs x 8 TPs (1..128) x 4 batches.
        assert_eq!(r.tried, 2 * 8 * 4);
        assert_eq!(
            r.tried,
            r.layouts.len() + r.skipped_capacity + r.skipped_invalid + r.skipped_constraints
        );
        // 70B in bf16 (141 GB) does not fit one logical core: tp=1 is skipped as capacity;
        // tp=128 at LNC=2 has more ranks than the 64 logical cores: invalid.
        assert!(r.skipped_capacity > 0 && r.skipped_invalid > 0);
        assert!(!r.layouts.iter().any(|c| c.tp == 1));
        let best = &r.layouts[0];
        assert!(r.layouts.iter().all(|c| best.itl_s <= c.itl_s));
        // Throughput: the best has the most tokens per second.
        let t = search(&m, &space(Objective::Throughput)).expect("search");
        assert!(t.layouts.iter().all(|c| t.layouts[0].tokens_per_s >= c.tokens_per_s));
    }

    #[test]
    fn cost_needs_a_price_and_training_ranks_by_throughput() {
        let m = Model::preset("llama-3.1-8b").expect("preset");
        let e = search(&m, &space(Objective::Cost)).expect_err("no price");
        assert_eq!(arg_of(&e), Some("price_per_hour"));
        let mut s = space(Objective::Cost);
        s.price_per_hour = Some(36.0);
        s.tp = vec![8, 16];
        s.lnc = vec![2];
        let r = search(&m, &s).expect("search");
        let c = &r.layouts[0];
        // $36/h = 1 cent/s: cost per million tokens = 0.01 x 1e6 / tokens_per_s.
        let want = 0.01 * 1e6 / c.tokens_per_s;
        assert!((c.cost_per_mtok.expect("price") / want - 1.0).abs() < 1e-12);
        let mut tr = space(Objective::Itl);
        tr.train = true;
        let e = search(&m, &tr).expect_err("latency for training");
        assert_eq!(arg_of(&e), Some("objective"));
        tr.objective = Objective::Throughput;
        tr.tp = vec![8];
        tr.lnc = vec![2];
        let r = search(&m, &tr).expect("train search");
        assert!(!r.layouts.is_empty());
        for c in &r.layouts {
            assert_eq!(c.tp * c.pp * c.dp, 64);
            assert!(c.mfu > 0.0 && c.mfu <= 1.0);
        }
    }
}
