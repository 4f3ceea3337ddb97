//! Device allocations the client places itself: each device's window (address space the
//! server reserved for the session), which parts of it hold allocations, and how much more
//! may be placed without asking the GPU. Pure data: `crate::custom::placed` asks for the
//! window, answers `cudaMalloc` from here and sends the server what to back.
//!
//! What may be placed: whole granules (from [`ROUNDED_MIN`] on, any size rounded up to
//! them), while what was placed and not freed, with what the program allocated through the
//! server since (its allocations that waited), stays within the device memory free when the
//! window was made, less a margin (what the server's libraries, cuFFT's and cuDNN's work
//! areas, and other programs may still take). Beyond that an allocation waits for the GPU's
//! own answer (out of memory is then the GPU's to say, as torch's allocator needs to hear to
//! free its cache and try again).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// What the client knows of a device's window.
enum Device {
    /// Asked, and refused (a server whose driver cannot): allocations wait.
    Refused,
    Open(Window),
}

/// One device's window.
struct Window {
    /// The whole granules of the window: (start, length).
    span: (u64, u64),
    granularity: u64,
    /// Bytes that may be placed and not freed at once.
    budget: u64,
    /// Bytes placed and not freed.
    placed: u64,
    /// Allocations the server made for the program since the window was made, not freed:
    /// base → length (they take from the same free memory).
    others: HashMap<u64, u64>,
    others_bytes: u64,
    /// Unused parts of the window: start → length.
    holes: BTreeMap<u64, u64>,
    /// Allocations: base → length.
    allocations: BTreeMap<u64, u64>,
}

/// The smallest allocation placed although it is not whole granules: rounded up to them,
/// at most a third of what it takes is not asked for (and at most one granule).
pub const ROUNDED_MIN: u64 = 4 << 20;

/// The margin kept from the free memory: 1/8 of it, at least 1 GiB.
fn margin(free: u64) -> u64 {
    (free / 8).max(1 << 30)
}

impl Window {
    fn place(&mut self, size: u64) -> Option<u64> {
        let taken = self.placed.saturating_add(self.others_bytes);
        if size == 0 || !size.is_multiple_of(self.granularity) || taken.saturating_add(size) > self.budget {
            return None;
        }
        let (&start, &len) = self.holes.iter().find(|&(_, &len)| len >= size)?;
        self.holes.remove(&start);
        if len > size {
            self.holes.insert(start + size, len - size);
        }
        self.allocations.insert(start, size);
        self.placed += size;
        Some(start)
    }

    fn release(&mut self, base: u64) -> Option<u64> {
        let size = self.allocations.remove(&base)?;
        self.placed -= size;
        let (mut start, mut len) = (base, size);
        if let Some((&before, &before_len)) = self.holes.range(..base).next_back()
            && before + before_len == base
        {
            self.holes.remove(&before);
            start = before;
            len += before_len;
        }
        if let Some(after_len) = self.holes.remove(&(base + size)) {
            len += after_len;
        }
        self.holes.insert(start, len);
        Some(size)
    }

    /// The allocation holding `address`: (its base, its length).
    fn holding(&self, address: u64) -> Option<(u64, u64)> {
        let (&base, &len) = self.allocations.range(..=address).next_back()?;
        (address < base + len).then_some((base, len))
    }
}

/// What a free names, for [`Windows::owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// The base of an allocation placed by the client.
    Base,
    /// An address inside one, not its base (cudaFree refuses it).
    Inside,
}

/// The windows of one process, by device.
#[derive(Default)]
pub struct Windows {
    devices: Mutex<Option<HashMap<i32, Device>>>,
}

impl Windows {
    pub const fn new() -> Self {
        Windows { devices: Mutex::new(None) }
    }

    fn lock(&self) -> MutexGuard<'_, Option<HashMap<i32, Device>>> {
        self.devices.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `device`'s window was asked for already (opened or refused).
    pub fn asked(&self, device: i32) -> bool {
        self.lock().as_ref().is_some_and(|d| d.contains_key(&device))
    }

    /// The server reserved `[base, base + size)` on `device`, in granules of `granularity`,
    /// with `free` bytes of device memory free then.
    pub fn opened(&self, device: i32, base: u64, size: u64, granularity: u64, free: u64) {
        let granularity = granularity.max(1);
        // Only whole granules of the window are used.
        let first = base.div_ceil(granularity).saturating_mul(granularity);
        let len = (base.saturating_add(size).saturating_sub(first) / granularity).saturating_mul(granularity);
        let holes = if len > 0 { BTreeMap::from([(first, len)]) } else { BTreeMap::new() };
        let budget = free.saturating_sub(margin(free));
        let window = Window {
            span: (first, len),
            granularity,
            budget,
            placed: 0,
            others: HashMap::new(),
            others_bytes: 0,
            holes,
            allocations: BTreeMap::new(),
        };
        self.lock().get_or_insert_with(HashMap::new).insert(device, Device::Open(window));
    }

    /// The server has no window for `device`: its allocations wait.
    pub fn refused(&self, device: i32) {
        self.lock().get_or_insert_with(HashMap::new).insert(device, Device::Refused);
    }

    /// Place `size` bytes on `device`: the address and the part of the window it takes
    /// (whole granules: `size`, or from [`ROUNDED_MIN`] on, `size` rounded up to them), or
    /// None where the allocation must wait (no window, too small a piece of a granule,
    /// beyond the budget, no hole large enough).
    pub fn place(&self, device: i32, size: u64) -> Option<(u64, u64)> {
        match self.lock().as_mut()?.get_mut(&device)? {
            Device::Open(w) => {
                let g = w.granularity;
                let part = if size.is_multiple_of(g) {
                    size
                } else if size >= ROUNDED_MIN.max(2 * g) {
                    size.div_ceil(g).checked_mul(g)?
                } else {
                    return None;
                };
                w.place(part).map(|address| (address, part))
            }
            Device::Refused => None,
        }
    }

    /// Whether `address` lies in an allocation placed by the client, and where.
    pub fn owner(&self, address: u64) -> Option<Owned> {
        let devices = self.lock();
        devices.as_ref()?.values().find_map(|d| match d {
            Device::Open(w) => {
                w.holding(address).map(|(base, _)| if base == address { Owned::Base } else { Owned::Inside })
            }
            Device::Refused => None,
        })
    }

    /// `device`'s primary context was reset, which frees every allocation on it: the bases
    /// of those placed here (the server must free them too).
    pub fn reset(&self, device: i32) -> Vec<u64> {
        let mut devices = self.lock();
        let Some(Device::Open(w)) = devices.as_mut().and_then(|d| d.get_mut(&device)) else { return Vec::new() };
        let bases = std::mem::take(&mut w.allocations).into_keys().collect();
        w.placed = 0;
        w.others.clear();
        w.others_bytes = 0;
        w.holes = if w.span.1 > 0 { BTreeMap::from([w.span]) } else { BTreeMap::new() };
        bases
    }

    /// The server made an allocation of `size` bytes at `base` on `device` for the program
    /// (one that waited): it takes from the free memory placements count on.
    pub fn noted(&self, device: i32, base: u64, size: u64) {
        if let Some(Device::Open(w)) = self.lock().as_mut().and_then(|d| d.get_mut(&device))
            && w.others.insert(base, size).is_none()
        {
            w.others_bytes = w.others_bytes.saturating_add(size);
        }
    }

    /// An allocation the server made was freed (one noted, or any other: then nothing).
    pub fn forgotten(&self, base: u64) {
        if let Some(devices) = self.lock().as_mut() {
            for d in devices.values_mut() {
                if let Device::Open(w) = d
                    && let Some(size) = w.others.remove(&base)
                {
                    w.others_bytes = w.others_bytes.saturating_sub(size);
                    return;
                }
            }
        }
    }

    /// The allocation at `base` was freed: its part of the window may be placed again.
    pub fn release(&self, base: u64) {
        if let Some(devices) = self.lock().as_mut() {
            for d in devices.values_mut() {
                if let Device::Open(w) = d
                    && w.release(base).is_some()
                {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn allocations_are_placed_first_fit_and_freed_parts_joined() {
        let w = Windows::new();
        assert_eq!(w.place(0, G).map(|p| p.0), None, "no window yet");
        assert!(!w.asked(0));
        w.opened(0, 100 * G, 10 * G, G, 64 * GIB);
        assert!(w.asked(0));
        let a = w.place(0, 2 * G).map(|p| p.0).unwrap();
        let b = w.place(0, 3 * G).map(|p| p.0).unwrap();
        let c = w.place(0, G).map(|p| p.0).unwrap();
        assert_eq!((a, b, c), (100 * G, 102 * G, 105 * G));
        assert_eq!(w.place(0, 5 * G).map(|p| p.0), None, "4 granules are left");
        assert_eq!(w.place(0, G + 4096).map(|p| p.0), None, "a piece of a granule too small to round up");
        assert_eq!(w.owner(b), Some(Owned::Base));
        assert_eq!(w.owner(b + 4096), Some(Owned::Inside));
        assert_eq!(w.owner(99 * G), None);
        w.release(a);
        w.release(b);
        assert_eq!(w.owner(b), None);
        // a and b's parts joined into one hole of 5 granules, placed first.
        assert_eq!(w.place(0, 5 * G).map(|p| p.0), Some(100 * G));
        w.release(c);
        w.release(100 * G);
        assert_eq!(w.place(0, 10 * G).map(|p| p.0), Some(100 * G), "everything joined again");
        // A reset frees everything; another reset finds nothing to free.
        assert_eq!(w.reset(0), [100 * G]);
        assert!(w.reset(0).is_empty());
        assert!(w.reset(3).is_empty());
        assert_eq!(w.owner(100 * G), None);
        assert_eq!(w.place(0, 4 * G).map(|p| p.0), Some(100 * G));
        // From 4 MiB on, a size that is not whole granules takes them rounded up.
        let odd = w.place(0, 2 * G + 1).unwrap();
        assert_eq!(odd, (104 * G, 3 * G));
        assert_eq!(w.owner(106 * G + 100), Some(Owned::Inside), "the rounded part is the allocation's");
        assert_eq!(w.place(0, 3 * G + 1), None, "rounded up, it needs 4 of the 3 granules left");
    }

    #[test]
    fn what_is_placed_stays_within_the_free_memory_less_a_margin() {
        let w = Windows::new();
        // 4.5 GiB free: a margin of 1 GiB, 3.5 GiB may be placed.
        w.opened(0, 0, 64 * GIB, G, 4 * GIB + GIB / 2);
        assert!(w.place(0, 3 * GIB).map(|p| p.0).is_some());
        assert_eq!(w.place(0, GIB).map(|p| p.0), None);
        let last = w.place(0, GIB / 2).map(|p| p.0).unwrap();
        assert_eq!(w.place(0, G).map(|p| p.0), None);
        w.release(last);
        // What the server allocated for the program takes from it too, until freed.
        w.noted(0, 0x7000_0000, GIB / 4);
        w.noted(0, 0x7000_0000, GIB / 4);
        assert_eq!(w.place(0, GIB / 2).map(|p| p.0), None);
        assert!(w.place(0, GIB / 4).map(|p| p.0).is_some());
        w.forgotten(0x7000_0000);
        w.forgotten(0x7000_0000);
        assert!(w.place(0, GIB / 4).map(|p| p.0).is_some());
        assert_eq!(w.place(0, G).map(|p| p.0), None);
    }

    proptest::proptest! {
        /// Any sequence of allocations and frees: what is placed lies in the window, apart,
        /// within the budget, and the holes and allocations cover the window exactly; an
        /// allocation is refused only where no hole fits or the budget would be passed.
        #[test]
        fn placements_tile_the_window_within_the_budget(
            ops in proptest::collection::vec((0u64..6, 0usize..8, proptest::bool::ANY), 1..120)
        ) {
            let w = Windows::new();
            // 32 granules of window; 1 GiB and 20 granules free: a budget of 20 granules
            // (the margin is 1 GiB).
            w.opened(0, 64 * G, 32 * G, G, GIB + 20 * G);
            let budget = 20 * G;
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (granules, pick, free) in ops {
                if free && !live.is_empty() {
                    let (base, _) = live.remove(pick % live.len());
                    proptest::prop_assert_eq!(w.owner(base), Some(Owned::Base));
                    w.release(base);
                    proptest::prop_assert_eq!(w.owner(base), None);
                    continue;
                }
                let size = granules * G;
                let placed: u64 = live.iter().map(|&(_, l)| l).sum();
                match w.place(0, size).map(|p| p.0) {
                    Some(base) => {
                        proptest::prop_assert!(size > 0 && placed + size <= budget);
                        proptest::prop_assert!(base >= 64 * G && base + size <= 96 * G);
                        proptest::prop_assert!(live.iter().all(|&(a, l)| base + size <= a || a + l <= base));
                        live.push((base, size));
                    }
                    None => {
                        // Refused: nothing asked, past the budget, or no run of free granules.
                        let mut used = [false; 32];
                        for &(a, l) in &live {
                            for g in (a - 64 * G) / G..(a + l - 64 * G) / G {
                                used[g as usize] = true;
                            }
                        }
                        let longest = used.split(|&u| u).map(<[bool]>::len).max().unwrap_or(0) as u64;
                        proptest::prop_assert!(size == 0 || placed + size > budget || longest < granules);
                    }
                }
            }
            let devices = w.lock();
            let Some(Device::Open(window)) = devices.as_ref().and_then(|d| d.get(&0)) else { panic!("no window") };
            let holes: u64 = window.holes.values().sum();
            let placed: u64 = window.allocations.values().sum();
            proptest::prop_assert_eq!(holes + placed, 32 * G);
            proptest::prop_assert_eq!(placed, window.placed);
        }
    }

    #[test]
    fn a_refused_device_places_nothing_and_an_unaligned_window_only_whole_granules() {
        let w = Windows::new();
        w.refused(1);
        assert!(w.asked(1));
        assert_eq!(w.place(1, G).map(|p| p.0), None);
        w.opened(0, G / 2, 3 * G, G, 64 * GIB);
        assert_eq!(w.place(0, G).map(|p| p.0), Some(G));
        assert_eq!(w.place(0, G).map(|p| p.0), Some(2 * G));
        assert_eq!(w.place(0, G).map(|p| p.0), None, "the half granules at both ends are not used");
    }
}
