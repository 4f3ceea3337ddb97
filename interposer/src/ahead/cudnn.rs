//! The cuDNN part of the engine: what torch's cuDNN frontend asks about backend
//! descriptors after a waiting finalize or a fill, learned per descriptor type (and per slot
//! of the caller's array), planned ahead of the next descriptor of that type, and the fills
//! made ahead into the client's own "shadow" descriptors ("twins") that answer the
//! program's identical fills. Pure data and decisions: `crate::custom::cudnn` sends the
//! calls a [`Plan`] names and feeds the replies back (see `docs/ahead.md`).

use std::collections::{HashMap, HashSet};

/// What one Get answered: the status, `*elementCount`, and the array as the server sent it
/// (`requested` elements of the attribute type's size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u32,
    pub count: i64,
    pub bytes: Vec<u8>,
}

/// A Get's question: (attribute, attribute type, requested elements, whether an array
/// travels). Without an array it asks the count (torch's frontend asks an engine's notes
/// that way before it reads them).
pub type Query = (u32, u32, i64, bool);

/// A Get of descriptors: (attribute, requested descriptors, their descriptor type).
pub type FillQuery = (u32, i64, u32);

/// `*elementCount` before a fill: the library leaves it for some attributes (an engine
/// configuration's engine), and a successful fill then filled every requested descriptor.
pub const UNWRITTEN: i64 = i64::MIN;

/// How many of `requested` descriptors a fill that answered `status` and `count` filled.
pub fn filled_by(status: u32, count: i64, requested: usize) -> usize {
    match (status, count) {
        (0, UNWRITTEN) => requested,
        (0, n) => usize::try_from(n).unwrap_or(0).min(requested),
        _ => 0,
    }
}

/// A fill the client made ahead of the program, into descriptors of its own ("shadows")
/// made like the program makes its own: the same call on the same, unchanged source. When
/// the program asks it, its answer is this one's, the program's descriptors are filled by
/// the same call sent without waiting, and what was asked of each shadow becomes known of
/// the program's descriptor in its place.
///
/// The call may ask for fewer descriptors than the program will (one more than the library
/// filled before: the frontend asks an engine configuration for 44 knob choices and gets
/// one), or for more (the heuristics of one graph offer five configurations, of the next
/// six: the frontend asks for as many as the count it was given): a count below what the
/// call asked for is then all there is, and a program's call asking for at least as many
/// fills the same (whether the library counts what it filled or what it has, both are that
/// count). A count that reaches what was asked says nothing of the rest, and only the
/// identical call is answered.
pub struct Twin {
    /// The fill planned: (attribute, most the program asked for, descriptor type).
    pub query: FillQuery,
    pub status: u32,
    pub count: i64,
    pub shadows: Vec<u64>,
}

impl Twin {
    /// Whether this fill answers the program's: the same attribute and descriptor type, it
    /// succeeded, and it asked for as many descriptors, or was filled short of what it asked
    /// for and the program asks for at least what it filled.
    pub fn answers(&self, (name, requested, ty): FillQuery) -> bool {
        let short =
            self.count != UNWRITTEN && (0..self.shadows.len() as i64).contains(&self.count) && self.count <= requested;
        (self.query.0, self.query.2) == (name, ty)
            && self.status == 0
            && (self.shadows.len() as i64 == requested || short)
    }
}

/// What is known of a descriptor that does not change until a Set, Finalize, fill or its
/// destroy: answers to questions, and fills made ahead.
#[derive(Default)]
pub struct Known {
    /// Where a fill put it in the caller's array (the frontend reads the knobs of the
    /// configuration it builds a plan from, not of every one the heuristics offer).
    pub slot: Option<u8>,
    /// Answers, each with whether it is in the learned store (one that rode with a finalize
    /// or fill is kept there when the program first asks it: its descriptor's content is
    /// known by then).
    pub answers: Vec<(Query, Answer, bool)>,
    pub twins: Vec<Twin>,
    /// Fills the program made from this descriptor, and how often (the frontend fills an
    /// engine from a configuration once to read its notes and again to build the plan).
    pub made: Vec<(FillQuery, u32)>,
}

impl Known {
    /// Count one more fill of `query` by the program; which one it is (1, 2, ...).
    pub fn made(&mut self, query: FillQuery) -> u32 {
        match self.made.iter_mut().find(|(q, _)| *q == query) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.made.push((query, 1));
                1
            }
        }
    }
}

/// Most questions and fills learned per descriptor type, and most calls made ahead of one
/// waiting call.
pub const LEARNED_MAX: usize = 8;
pub const PLAN_MAX: usize = 1024;
/// The largest array a learned question may ask for, and the most descriptors a learned
/// fill may make.
pub const REQUESTED_MAX: i64 = 64;
/// How deep fills made ahead nest (heuristics -> configurations -> engines, knobs), and
/// most fills of one kind made ahead from one descriptor.
pub const DEPTH_MAX: usize = 3;
pub const REPEAT_MAX: u32 = 4;
/// Most shadows alive at once: the frontend keeps the descriptors of every graph it built
/// (torch caches them), and a fill made ahead that the program never asked for would keep
/// its shadows alive as long; past this, those of the oldest sources are destroyed.
pub const SHADOWS_MAX: usize = 4096;

/// Where a fill learned for a descriptor type applies: descriptors of that type filled into
/// this slot of the caller's array (None: made by the program, or past slot 255).
pub type Slot = Option<u8>;

/// The program's questions about descriptors whose answers cannot change (filled by a Get,
/// or finalized with a wait), learned per descriptor type and asked of the next descriptors
/// of that type in the round trip that fills or finalizes them. torch's frontend, building a
/// cuDNN graph, finalizes the heuristics, asks for their count and configurations, then of
/// each configuration its engine, the engine's notes and index, its knobs: all of it rides
/// with the heuristics' finalize, and the program's own calls are answered here. Only the
/// same question about the same, unchanged descriptor is answered from here: a Get has no
/// side effects, and a descriptor changes only by a fill, a Set, a Finalize or its destroy,
/// each of which drops what is known (and the shadows made for it).
#[derive(Default)]
pub struct Replay {
    pub learned: HashMap<u32, Vec<Query>>,
    pub learned_fills: HashMap<(u32, Slot), Vec<LearnedFill>>,
    pub known: HashMap<u64, Known>,
    /// Descriptors the program created and has not used yet: a fill into them is the same
    /// call as a fill into shadows just created.
    pub fresh: HashSet<u64>,
    /// Shadows alive, and the sources fills were made ahead for, oldest first.
    pub shadows_live: usize,
    pub sources: std::collections::VecDeque<u64>,
    /// What each client-named descriptor holds, as a hash of how it was made ([`Contents`]).
    pub contents: Contents,
}

/// What descriptors hold, as hashes of how they were made: a descriptor created is its
/// type; each Set adds the attribute, its type, the count and the elements (a descriptor
/// element as what *it* holds, a cuDNN handle as "a handle"); a finalize marks it; a
/// descriptor the library filled is what its source holds and which fill, slot, put it
/// there. A descriptor changed in a way the client cannot follow (a Set of device
/// pointers, a descriptor element whose content is unknown) has none. Two descriptors with
/// the same hash were made the same way, so the library answers the same about them: that
/// is what answers learned in an earlier build or session are keyed by. The hashes are
/// this release's (`DefaultHasher`): keys kept on disk carry the release.
#[derive(Default)]
pub struct Contents {
    of: HashMap<u64, u64>,
}

impl Contents {
    fn hash(parts: impl std::hash::Hash) -> u64 {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        parts.hash(&mut h);
        h.finish()
    }

    pub fn of(&self, d: u64) -> Option<u64> {
        self.of.get(&d).copied()
    }

    pub fn created(&mut self, d: u64, ty: u32) {
        self.of.insert(d, Self::hash(("created", ty)));
    }

    /// A Set on `d`: `elements` its elements as they bear on content (None: unknown).
    pub fn set(&mut self, d: u64, attribute: (u32, u32, i64), elements: Option<&[u8]>) {
        match (self.of.get(&d), elements) {
            (Some(&was), Some(e)) => _ = self.of.insert(d, Self::hash((was, "set", attribute, e))),
            _ => _ = self.of.remove(&d),
        }
    }

    pub fn finalized(&mut self, d: u64) {
        if let Some(was) = self.of.get(&d).copied() {
            self.of.insert(d, Self::hash((was, "finalized")));
        }
    }

    /// The library filled `targets` (the first `filled` of them) from `source` with the
    /// fill `query`; the rest hold nothing known.
    pub fn filled(&mut self, source: u64, query: FillQuery, targets: &[u64], filled: usize) {
        let from = self.of(source);
        for (i, &t) in targets.iter().enumerate() {
            match from.filter(|_| i < filled) {
                Some(from) => _ = self.of.insert(t, Self::hash((from, "filled", query, i))),
                None => _ = self.of.remove(&t),
            }
        }
    }

    /// The bytes a descriptor element of a Set stands for: what it holds (None: unknown).
    pub fn element(&self, d: u64) -> Option<[u8; 8]> {
        self.of(d).map(u64::to_le_bytes)
    }

    pub fn forget(&mut self, d: u64) {
        self.of.remove(&d);
    }
}

impl Answer {
    /// As kept for later sessions ([`crate::ahead::learned::Space::CudnnBackend`]): the
    /// status, `*elementCount` and the array, little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + self.bytes.len());
        v.extend_from_slice(&self.status.to_le_bytes());
        v.extend_from_slice(&self.count.to_le_bytes());
        v.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.bytes);
        v
    }

    /// What [`Answer::encode`] wrote; None for anything else (a record of another layout).
    pub fn decode(b: &[u8]) -> Option<Answer> {
        let (status, b) = b.split_first_chunk::<4>()?;
        let (count, b) = b.split_first_chunk::<8>()?;
        let (len, bytes) = b.split_first_chunk::<4>()?;
        (bytes.len() == u32::from_le_bytes(*len) as usize).then(|| Answer {
            status: u32::from_le_bytes(*status),
            count: i64::from_le_bytes(*count),
            bytes: bytes.to_vec(),
        })
    }
}

/// A fill learned per source descriptor type and slot, one per attribute and descriptor
/// type: (fill asking for the most the program asked for, the most descriptors the library
/// filled, most times one source was filled so). The most, not the last: heuristics offer
/// graph by graph a few configurations more or fewer, and a fill made ahead for the most
/// comes back short for every graph (see [`Twin`]).
pub type LearnedFill = (FillQuery, i64, u32);

/// The calls to make ahead for a descriptor of one type: its learned questions, and its
/// learned fills (each with the descriptors to ask for) with the plan of each descriptor
/// they are expected to fill.
#[derive(Default)]
pub struct Plan {
    pub queries: Vec<Query>,
    pub fills: Vec<(FillQuery, usize, Vec<Plan>)>,
}

pub fn slot(i: usize) -> Slot {
    u8::try_from(i).ok()
}

impl Replay {
    pub fn plan(&self, ty: u32, at: Slot, depth: usize, budget: &mut usize) -> Plan {
        let mut plan = Plan::default();
        for &q in self.learned.get(&ty).map(Vec::as_slice).unwrap_or(&[]) {
            if *budget == 0 {
                return plan;
            }
            *budget -= 1;
            plan.queries.push(q);
        }
        if depth >= DEPTH_MAX {
            return plan;
        }
        for &(fq, last, times) in self.learned_fills.get(&(ty, at)).map(Vec::as_slice).unwrap_or(&[]) {
            let last = last.clamp(0, fq.1);
            // One more than last time where that saves most of the shadows (a shorter count
            // shows there is no more); else as many as the program asks for, so that a
            // fill that did not skip any would answer it whatever the count says.
            let shadows = if (last + 1) * 2 <= fq.1 { last + 1 } else { fq.1 } as usize;
            for _ in 0..times.clamp(1, REPEAT_MAX) {
                let cost = shadows + 1;
                if *budget < cost {
                    return plan;
                }
                *budget -= cost;
                let nested = (0..last as usize).map(|i| self.plan(fq.2, slot(i), depth + 1, budget)).collect();
                plan.fills.push((fq, shadows, nested));
            }
        }
        plan
    }

    /// Drop what is known of `d`; the shadows made for it, to destroy, go to `out`.
    pub fn drop_known(&mut self, d: u64, out: &mut Vec<u64>) {
        if let Some(k) = self.known.remove(&d) {
            self.drop_twins(k.twins, out);
        }
    }

    pub fn drop_twins(&mut self, twins: Vec<Twin>, out: &mut Vec<u64>) {
        for twin in twins {
            self.shadows_live = self.shadows_live.saturating_sub(twin.shadows.len());
            for s in twin.shadows {
                self.drop_known(s, out);
                out.push(s);
            }
        }
    }

    /// Fills were made ahead for `source`: past [`SHADOWS_MAX`] live shadows, drop those
    /// made for the oldest sources (to destroy: `out`).
    pub fn made_ahead_for(&mut self, source: u64, shadows: usize, out: &mut Vec<u64>) {
        self.shadows_live += shadows;
        self.sources.push_back(source);
        while self.shadows_live > SHADOWS_MAX {
            let Some(old) = self.sources.pop_front() else { break };
            if let Some(k) = self.known.get_mut(&old) {
                let twins = std::mem::take(&mut k.twins);
                self.drop_twins(twins, out);
            }
        }
        if self.sources.len() > 4 * SHADOWS_MAX {
            let known = &self.known;
            self.sources.retain(|s| known.get(s).is_some_and(|k| !k.twins.is_empty()));
        }
    }

    /// What was learned (questions and fills per descriptor type), as bytes to keep for a
    /// later process: records of a tag (1 question, 2 fill) and little-endian fields.
    pub fn patterns(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut types: Vec<_> = self.learned.iter().collect();
        types.sort_by_key(|(t, _)| **t);
        for (ty, queries) in types {
            for &(attr, attr_type, requested, array) in queries {
                out.push(1);
                out.extend_from_slice(&ty.to_le_bytes());
                out.extend_from_slice(&attr.to_le_bytes());
                out.extend_from_slice(&attr_type.to_le_bytes());
                out.extend_from_slice(&requested.to_le_bytes());
                out.push(u8::from(array));
            }
        }
        let mut fills: Vec<_> = self.learned_fills.iter().collect();
        fills.sort_by_key(|(k, _)| **k);
        for ((ty, at), learned) in fills {
            for &((attr, requested, desc_type), last, times) in learned {
                out.push(2);
                out.extend_from_slice(&ty.to_le_bytes());
                out.extend_from_slice(&[u8::from(at.is_some()), at.unwrap_or(0)]);
                out.extend_from_slice(&attr.to_le_bytes());
                out.extend_from_slice(&requested.to_le_bytes());
                out.extend_from_slice(&desc_type.to_le_bytes());
                out.extend_from_slice(&last.to_le_bytes());
                out.extend_from_slice(&times.to_le_bytes());
            }
        }
        out
    }

    /// Learn what [`Replay::patterns`] kept (up to the first record it cannot read: a file
    /// cut short or of another layout is only a smaller head start).
    pub fn learn_patterns(&mut self, mut bytes: &[u8]) {
        fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
            let (head, rest) = b.split_first_chunk::<N>()?;
            *b = rest;
            Some(*head)
        }
        loop {
            let Some([tag]) = take::<1>(&mut bytes) else { return };
            let mut read = |b: &mut &[u8]| -> Option<()> {
                let ty = u32::from_le_bytes(take(b)?);
                match tag {
                    1 => {
                        let attr = u32::from_le_bytes(take(b)?);
                        let attr_type = u32::from_le_bytes(take(b)?);
                        let requested = i64::from_le_bytes(take(b)?);
                        let [array] = take::<1>(b)?;
                        self.learn(ty, (attr, attr_type, requested, array != 0));
                    }
                    2 => {
                        let [has, at] = take::<2>(b)?;
                        let attr = u32::from_le_bytes(take(b)?);
                        let requested = i64::from_le_bytes(take(b)?);
                        let desc_type = u32::from_le_bytes(take(b)?);
                        let last = i64::from_le_bytes(take(b)?);
                        let times = u32::from_le_bytes(take(b)?);
                        let at = (has != 0).then_some(at);
                        self.learn_fill((ty, at), (attr, requested, desc_type), last, times.min(REPEAT_MAX));
                    }
                    _ => return None,
                }
                Some(())
            };
            if read(&mut bytes).is_none() {
                return;
            }
        }
    }

    pub fn learn(&mut self, ty: u32, query: Query) {
        let learned = self.learned.entry(ty).or_default();
        if !learned.contains(&query) && learned.len() < LEARNED_MAX && query.2 <= REQUESTED_MAX {
            learned.push(query);
        }
    }

    pub fn learn_fill(&mut self, ty: (u32, Slot), query: FillQuery, count: i64, nth: u32) {
        let learned = self.learned_fills.entry(ty).or_default();
        let (name, requested, desc_type) = query;
        if let Some((q, last, times)) = learned.iter_mut().find(|(q, _, _)| (q.0, q.2) == (name, desc_type)) {
            if requested <= REQUESTED_MAX {
                q.1 = q.1.max(requested);
            }
            *last = (*last).max(count);
            *times = (*times).max(nth);
        } else if learned.len() < LEARNED_MAX && query.1 <= REQUESTED_MAX {
            learned.push((query, count, nth));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_made_the_same_way_hold_the_same() {
        let mut c = Contents::default();
        let (graph, a, b) = (1, 2, 3);
        c.created(graph, 1);
        for d in [a, b] {
            c.created(d, 9);
            c.set(d, (100, 15, 1), c.element(graph).as_ref().map(|e| &e[..]));
            c.set(d, (101, 3, 1), Some(&7i64.to_le_bytes()));
        }
        assert_eq!(c.of(a), c.of(b));
        c.finalized(a);
        assert_ne!(c.of(a), c.of(b), "a finalized descriptor is another");
        c.finalized(b);
        assert_eq!(c.of(a), c.of(b));
        // Another value, or an element nobody knows, makes another (or no) content.
        let d = 4;
        c.created(d, 9);
        c.set(d, (100, 15, 1), c.element(graph).as_ref().map(|e| &e[..]));
        c.set(d, (101, 3, 1), Some(&8i64.to_le_bytes()));
        assert_ne!(c.of(d), c.of(b));
        c.set(d, (102, 15, 1), c.element(99).as_ref().map(|e| &e[..]));
        assert_eq!(c.of(d), None);
        c.set(d, (101, 3, 1), Some(&8i64.to_le_bytes()));
        assert_eq!(c.of(d), None, "unknown stays unknown");
        // What a fill put in its targets follows its source, the fill and the slot.
        c.filled(a, (202, 4, 3), &[10, 11, 12], 2);
        c.filled(b, (202, 4, 3), &[20, 21, 22], 2);
        assert_eq!((c.of(10), c.of(11)), (c.of(20), c.of(21)));
        assert_ne!(c.of(10), c.of(11));
        assert_eq!((c.of(12), c.of(22)), (None, None), "not filled");
        c.filled(d, (202, 4, 3), &[30], 1);
        assert_eq!(c.of(30), None, "from a source nobody knows");
    }

    #[test]
    fn kept_answers_survive_a_round_trip_and_refuse_junk() {
        let a = Answer { status: 0, count: 2, bytes: vec![1, 2, 3, 4] };
        let bytes = a.encode();
        assert_eq!(Answer::decode(&bytes), Some(a.clone()));
        assert_eq!(Answer::decode(&bytes[..bytes.len() - 1]), None, "cut short");
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Answer::decode(&longer), None, "trailing bytes");
        assert_eq!(Answer::decode(&[0; 15]), None, "no room for the head");
        let failed = Answer { status: 3000, count: UNWRITTEN, bytes: vec![] };
        assert_eq!(Answer::decode(&failed.encode()), Some(failed));
    }

    #[test]
    fn kept_answers_of_random_bytes_are_refused_or_read_never_a_panic() {
        // A store file is the user's own, but it may be cut, mixed or of another release.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = Answer { status: 0, count: 1, bytes: vec![7; 8] }.encode();
        for _ in 0..20_000 {
            let mut bytes = if next() % 2 == 0 { good.clone() } else { vec![0; (next() % 64) as usize] };
            for _ in 0..(next() % 4) {
                let at = (next() as usize) % bytes.len().max(1);
                if let Some(b) = bytes.get_mut(at) {
                    *b = next() as u8;
                }
            }
            bytes.truncate((next() as usize) % (bytes.len() + 1));
            if let Some(a) = Answer::decode(&bytes) {
                assert_eq!(a.encode(), bytes, "what is read is what was written");
            }
        }
    }

    #[test]
    fn learned_patterns_survive_a_round_trip_and_a_cut() {
        let mut r = Replay::default();
        r.learn(7, (3, 12, 1, true));
        r.learn(7, (5, 4, 8, false));
        r.learn_fill((9, Some(0)), (302, 44, 7), 1, 2);
        r.learn_fill((9, None), (301, 1, 8), -1, 1);
        let bytes = r.patterns();
        let mut again = Replay::default();
        again.learn_patterns(&bytes);
        assert_eq!(again.learned, r.learned);
        assert_eq!(again.learned_fills, r.learned_fills);
        // A file cut in the middle of a record keeps the records before it.
        let mut cut = Replay::default();
        cut.learn_patterns(&bytes[..bytes.len() - 3]);
        assert_eq!(cut.learned, r.learned);
        assert_eq!(cut.learned_fills.values().map(Vec::len).sum::<usize>(), 1);
        let mut junk = Replay::default();
        junk.learn_patterns(&[9, 1, 2, 3]);
        assert!(junk.learned.is_empty() && junk.learned_fills.is_empty());
    }

    /// Graph by graph the heuristics offer a few configurations more or fewer, and the
    /// frontend asks for as many as it was told: one learned fill covers them all (the
    /// learned list of a type once filled up with one entry per count, and the decode's
    /// next graphs were never made ahead), made ahead for the most.
    #[test]
    fn fills_of_other_counts_are_one_learned_fill_for_the_most() {
        let mut r = Replay::default();
        for requested in [5, 6, 5, 12, 3, 7, 9, 10, 11, 2, 8] {
            r.learn_fill((4, None), (202, requested, 3), requested, 1);
        }
        assert_eq!(r.learned_fills[&(4, None)], vec![((202, 12, 3), 12, 1)]);
        r.learn_fill((4, None), (202, 500, 3), 4, 1);
        assert_eq!(r.learned_fills[&(4, None)], vec![((202, 12, 3), 12, 1)], "past REQUESTED_MAX: not planned for");
        let mut budget = PLAN_MAX;
        let plan = r.plan(4, None, 0, &mut budget);
        assert_eq!(plan.fills.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(), vec![((202, 12, 3), 12)]);
        let twin = Twin { query: (202, 12, 3), status: 0, count: 5, shadows: vec![1; 12] };
        assert!(twin.answers((202, 5, 3)));
    }

    #[test]
    fn a_short_fill_answers_the_program_only_when_it_came_back_short() {
        let twin = |count, shadows: usize| Twin { query: (302, 44, 7), status: 0, count, shadows: vec![1; shadows] };
        assert!(twin(1, 2).answers((302, 44, 7)), "one of two set: there is no more");
        assert!(!twin(2, 2).answers((302, 44, 7)), "both set: there may be more");
        assert!(!twin(UNWRITTEN, 2).answers((302, 44, 7)), "no count: nothing is known of the rest");
        assert!(twin(UNWRITTEN, 44).answers((302, 44, 7)), "the program's own call");
        assert!(twin(1, 2).answers((302, 8, 7)), "fewer asked for, at least the one there is");
        assert!(twin(5, 7).answers((302, 6, 7)), "five of six offered: the program asks for six");
        assert!(twin(5, 7).answers((302, 5, 7)), "and for five");
        assert!(!twin(5, 7).answers((302, 4, 7)), "fewer than there are: the count is the library's to say");
        assert!(!twin(1, 2).answers((303, 44, 7)), "another attribute");
        assert!(!twin(1, 2).answers((302, 44, 8)), "another descriptor type");
        assert!(!Twin { status: 2000, ..twin(1, 2) }.answers((302, 44, 7)), "a failure is asked again");
    }

    #[test]
    fn fills_are_learned_per_slot_and_ask_one_more_than_last_time() {
        let mut r = Replay::default();
        // The configuration in slot 0 had its knobs read (one of 44 set); the one in slot 1
        // only its engine.
        r.learn_fill((3, Some(0)), (302, 44, 7), 1, 1);
        r.learn_fill((3, Some(0)), (300, 1, 2), 1, 2);
        r.learn_fill((3, Some(1)), (300, 1, 2), 1, 1);
        let mut budget = PLAN_MAX;
        let first = r.plan(3, Some(0), 1, &mut budget);
        let fills: Vec<_> = first.fills.iter().map(|(q, n, nested)| (*q, *n, nested.len())).collect();
        assert_eq!(fills, [((302, 44, 7), 2, 1), ((300, 1, 2), 1, 1), ((300, 1, 2), 1, 1)]);
        let second = r.plan(3, Some(1), 1, &mut budget);
        assert_eq!(second.fills.iter().map(|(q, n, _)| (*q, *n)).collect::<Vec<_>>(), [((300, 1, 2), 1)]);
        assert!(r.plan(3, Some(2), 1, &mut budget).fills.is_empty(), "nothing learned for slot 2");
        // The budget counts shadows and calls: 3 + 2 + 2, then 2.
        assert_eq!(budget, PLAN_MAX - 9);
    }

    #[test]
    fn shadows_past_the_most_alive_are_those_of_the_oldest_sources_destroyed() {
        let mut r = Replay::default();
        let mut out = Vec::new();
        let per = SHADOWS_MAX / 4;
        for source in 1..=5u64 {
            let shadows = (0..per as u64).map(|i| source << 32 | i).collect();
            let twin = Twin { query: (300, per as i64, 2), status: 0, count: UNWRITTEN, shadows };
            r.known.entry(source).or_default().twins.push(twin);
            r.made_ahead_for(source, per, &mut out);
        }
        assert_eq!(out.len(), per, "the first source's shadows go");
        assert!(out.iter().all(|s| s >> 32 == 1));
        assert!(r.known[&1].twins.is_empty() && r.known[&5].twins.len() == 1);
        assert_eq!(r.shadows_live, SHADOWS_MAX);
        // A twin the program uses, or a source it changes, no longer counts.
        let mut gone = Vec::new();
        r.drop_known(2, &mut gone);
        assert_eq!((gone.len(), r.shadows_live), (per, SHADOWS_MAX - per));
    }
}
