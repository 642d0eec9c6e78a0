//! The interval map both readers of the recorded program keep per memory: disjoint byte ranges
//! `start -> (end, entries)`, each entry saying something about some partitions of the range
//! (who last wrote them, when they were last read). The timeline ([`super::timeline`]) and the
//! loop-carried read finder ([`super::loops`]) differ only in their entries.

use std::collections::BTreeMap;

/// Disjoint byte ranges of one memory, each with its entries.
#[derive(Debug, Clone)]
pub(crate) struct Ranges<E> {
    segs: BTreeMap<u64, (u64, Vec<E>)>,
}

impl<E> Default for Ranges<E> {
    fn default() -> Self {
        Ranges { segs: BTreeMap::new() }
    }
}

impl<E: Clone> Ranges<E> {
    /// Makes `at` a range boundary (the range around it is cut in two, entries copied).
    fn split(&mut self, at: u64) {
        let found = self
            .segs
            .range(..at)
            .next_back()
            .filter(|(_, (e, _))| *e > at)
            .map(|(&s, (e, en))| (s, *e, en.clone()));
        if let Some((s, e, en)) = found {
            if let Some(v) = self.segs.get_mut(&s) {
                v.0 = at;
            }
            self.segs.insert(at, (e, en));
        }
    }

    /// The entries of every range inside `lo..hi`, after cutting ranges at `lo` and `hi` and
    /// filling the gaps between them with empty ranges, so that `lo..hi` is covered exactly.
    pub(crate) fn cover(&mut self, lo: u64, hi: u64) -> impl Iterator<Item = &mut Vec<E>> {
        // A segment that is exactly `lo..hi` (the usual case: a tile's range accessed again)
        // needs no cut and has no gap.
        let exact = self.segs.get(&lo).is_some_and(|(e, _)| *e == hi);
        if lo < hi && !exact {
            self.split(lo);
            self.split(hi);
            let mut cur = lo;
            let mut gaps = Vec::new();
            for (&s, (e, _)) in self.segs.range(lo..hi) {
                if s > cur {
                    gaps.push((cur, s));
                }
                cur = *e;
            }
            if cur < hi {
                gaps.push((cur, hi));
            }
            for (s, e) in gaps {
                self.segs.insert(s, (e, Vec::new()));
            }
        }
        self.segs.range_mut(lo..hi.max(lo)).map(|(_, (_, en))| en)
    }

    /// The entries of every range that overlaps `lo..hi`.
    pub(crate) fn overlapping(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Vec<E>> {
        let first = self
            .segs
            .range(..=lo)
            .next_back()
            .filter(|(_, (e, _))| *e > lo)
            .map(|(&s, _)| s)
            .unwrap_or(lo);
        self.segs.range(first..hi.max(first)).map(|(_, (_, en))| en)
    }
}

impl<E: Clone + PartialEq> Ranges<E> {
    /// Joins the range ending at `at` with the one starting there when their entries agree.
    pub(crate) fn merge_at(&mut self, at: u64) {
        let Some((&s, (e, en))) = self.segs.range(..at).next_back() else {
            return;
        };
        if *e != at {
            return;
        }
        let same = match self.segs.get(&at) {
            Some((_, next)) => next == en,
            None => false,
        };
        if same {
            if let Some((end, _)) = self.segs.remove(&at) {
                if let Some(v) = self.segs.get_mut(&s) {
                    v.0 = end;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    fn dump(r: &Ranges<u8>) -> Vec<(u64, u64, Vec<u8>)> {
        r.segs.iter().map(|(&s, (e, v))| (s, *e, v.clone())).collect()
    }

    #[test]
    fn cover_cuts_fills_and_merge_joins() {
        let mut r = Ranges::<u8>::default();
        r.cover(10, 20).for_each(|en| en.push(1));
        r.cover(15, 30).for_each(|en| en.push(2));
        assert_eq!(dump(&r), vec![(10, 15, vec![1]), (15, 20, vec![1, 2]), (20, 30, vec![2])]);
        let seen: Vec<Vec<u8>> = r.overlapping(12, 16).cloned().collect();
        assert_eq!(seen, vec![vec![1], vec![1, 2]]);
        assert_eq!(r.overlapping(30, 40).count(), 0);
        assert_eq!(r.cover(5, 5).count(), 0);
        r.cover(20, 30).for_each(|en| *en = vec![1, 2]);
        r.merge_at(20);
        assert_eq!(dump(&r), vec![(10, 15, vec![1]), (15, 30, vec![1, 2])]);
    }
}
