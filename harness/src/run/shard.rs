//! `--shard K/N`: one of N disjoint parts of a run's trials (or a mutation
//! run's mutants), so N machines (a CI matrix) share the work and `merge`
//! joins their run directories into one.
//!
//! Every shard computes the whole partition from the same inputs and keeps
//! its part, so the partition must be a function of those inputs alone: the
//! list of items in plan order and, when given, durations from a file every
//! shard reads the same (`--durations results.jsonl` of an earlier run).
//! Never the local run history, which differs between machines and changes
//! while shards run. With durations, the longest items go first to the
//! least-loaded shard (LPT); without, items go round-robin in plan order.

use std::collections::HashMap;

/// `K/N`, 1 ≤ K ≤ N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// 1-based.
    pub index: usize,
    pub count: usize,
}

/// The form `--shard` accepts, for error messages.
pub const SHARD_FORM: &str = "K/N with 1 <= K <= N (e.g. --shard 2/4)";

/// `--shard`'s value is not `K/N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a shard: use {SHARD_FORM}")]
pub struct NotAShard(pub String);

impl std::str::FromStr for Shard {
    type Err = NotAShard;
    fn from_str(s: &str) -> Result<Shard, NotAShard> {
        let bad = || NotAShard(s.to_string());
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The partition of `ids` into `count` parts: for each part, the indices
/// into `ids` it holds, in plan order.
pub fn partition(
    ids: &[String],
    count: usize,
    durations: &HashMap<String, f64>,
) -> Vec<Vec<usize>> {
    let mut parts: Vec<Vec<usize>> = vec![Vec::new(); count.max(1)];
    let known: Vec<f64> = ids
        .iter()
        .filter_map(|i| durations.get(i).copied())
        .collect();
    if known.is_empty() {
        let n = parts.len();
        for i in 0..ids.len() {
            parts[i % n].push(i);
        }
        return parts;
    }
    // An item with no recorded duration costs the mean of those with one.
    let mean = known.iter().sum::<f64>() / known.len() as f64;
    let cost = |i: usize| durations.get(&ids[i]).copied().unwrap_or(mean).max(0.0);
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by(|&a, &b| cost(b).total_cmp(&cost(a)).then(ids[a].cmp(&ids[b])));
    let mut load = vec![0.0f64; parts.len()];
    for i in order {
        let lightest = (0..parts.len())
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
            .expect("at least one part");
        load[lightest] += cost(i);
        parts[lightest].push(i);
    }
    for p in &mut parts {
        p.sort_unstable();
    }
    parts
}

/// The indices `shard` holds, and its expected seconds when durations are
/// known.
pub fn select(
    ids: &[String],
    shard: Shard,
    durations: &HashMap<String, f64>,
) -> (Vec<usize>, Option<f64>) {
    let parts = partition(ids, shard.count, durations);
    let mine = parts[shard.index - 1].clone();
    let expected = (!durations.is_empty()).then(|| {
        mine.iter()
            .map(|&i| durations.get(&ids[i]).copied().unwrap_or(0.0))
            .sum()
    });
    (mine, expected)
}

/// Durations by trial id from a `results.jsonl` (its `id` and `wall_secs`).
pub fn durations_from_results(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let (Some(id), Some(wall)) = (v["id"].as_str(), v["wall_secs"].as_f64()) {
            out.entry(id.to_owned()).or_insert(wall);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("k{}/s{i}", i % 5)).collect()
    }

    #[test]
    fn shards_parse_and_bad_ones_name_the_form() {
        assert_eq!(
            "2/4".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 4 }
        );
        for bad in ["0/4", "5/4", "x/y", "1/0", "3", ""] {
            let e = bad.parse::<Shard>().unwrap_err().to_string();
            assert!(e.contains("K/N with 1 <= K <= N"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_partition_is_disjoint_and_complete() {
        let items = ids(37);
        let timed: HashMap<String, f64> = items
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0) // some items have no recorded time
            .map(|(i, id)| (id.clone(), 1.0 + (i * 7 % 11) as f64))
            .collect();
        for durations in [HashMap::new(), timed] {
            for n in 1..=8 {
                let mut seen = vec![0usize; items.len()];
                for k in 1..=n {
                    let (mine, _) = select(&items, Shard { index: k, count: n }, &durations);
                    for i in mine {
                        seen[i] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n={n}: {seen:?}");
            }
        }
    }

    /// LPT keeps every shard within the longest item of the ideal share
    /// (makespan ≤ total/N + max).
    #[test]
    fn recorded_durations_balance_within_the_longest_item() {
        let items = ids(60);
        let durations: HashMap<String, f64> = items
            .iter()
            .enumerate()
            .map(|(i, id)| {
                (
                    id.clone(),
                    [0.8, 1.2, 3.5, 9.0, 27.0][i % 5] + i as f64 / 100.0,
                )
            })
            .collect();
        let total: f64 = durations.values().sum();
        let longest = durations.values().copied().fold(0.0, f64::max);
        for n in 2..=8 {
            for k in 1..=n {
                let (_, expected) = select(&items, Shard { index: k, count: n }, &durations);
                let e = expected.unwrap();
                assert!(
                    e <= total / n as f64 + longest,
                    "n={n} k={k}: {e} > {} + {longest}",
                    total / n as f64
                );
            }
        }
    }

    #[test]
    fn the_partition_depends_on_its_inputs_alone() {
        let items = ids(20);
        let d: HashMap<String, f64> = items.iter().map(|i| (i.clone(), 2.0)).collect();
        assert_eq!(partition(&items, 3, &d), partition(&items, 3, &d.clone()));
        assert_eq!(
            partition(&items, 4, &HashMap::new())[1],
            vec![1, 5, 9, 13, 17]
        );
    }
}
