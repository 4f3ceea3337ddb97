//! Allocation windows: address space the worker reserved on a device (`Service::MemoryWindow`)
//! where the client places device allocations itself, so that a program's `cudaMalloc`
//! returns without a round trip (`docs/ahead.md`). The client names each allocation's
//! address and size (`Service::WindowMap`); what is checked here is that the request is
//! one a correct client makes: inside the session's window on that device, at and of a
//! multiple of its granularity, overlapping no allocation of the window.

use std::collections::{BTreeMap, HashMap};

use crate::backend::Window;

#[derive(Debug, Default)]
pub struct Windows {
    /// The window of each device that has one.
    windows: HashMap<i32, Window>,
    /// The allocations made in them: base → (size, device).
    maps: BTreeMap<u64, (u64, i32)>,
}

impl Windows {
    /// The window of `device`, if one was made.
    pub fn window(&self, device: i32) -> Option<Window> {
        self.windows.get(&device).copied()
    }

    pub fn add_window(&mut self, device: i32, window: Window) {
        self.windows.insert(device, window);
    }

    /// Why an allocation of `size` bytes at `address` on `device` is not one to make (None:
    /// it is).
    pub fn refusal(&self, device: i32, address: u64, size: u64) -> Option<String> {
        let Some(w) = self.windows.get(&device) else {
            return Some(format!("device {device} has no allocation window in this session"));
        };
        let g = w.granularity.max(1);
        let end = address.checked_add(size);
        if size == 0 || !address.is_multiple_of(g) || !size.is_multiple_of(g) {
            return Some(format!("{size} bytes at {address:#x} are not whole granules of {g} bytes"));
        }
        if address < w.base || end.is_none_or(|e| e > w.base.saturating_add(w.size)) {
            return Some(format!("{size} bytes at {address:#x} lie outside device {device}'s window"));
        }
        let before = self.maps.range(..address.saturating_add(size)).next_back();
        if let Some((&base, &(len, _))) = before
            && base.saturating_add(len) > address
        {
            return Some(format!("{size} bytes at {address:#x} overlap the allocation at {base:#x}"));
        }
        None
    }

    pub fn mapped(&mut self, device: i32, address: u64, size: u64) {
        self.maps.insert(address, (size, device));
    }

    /// The allocation at `address` (its base): (size, device).
    pub fn allocation(&self, address: u64) -> Option<(u64, i32)> {
        self.maps.get(&address).copied()
    }

    pub fn unmapped(&mut self, address: u64) {
        self.maps.remove(&address);
    }

    /// The allocations on `device`: (base, size).
    pub fn on_device(&self, device: i32) -> Vec<(u64, u64)> {
        self.maps.iter().filter(|&(_, &(_, d))| d == device).map(|(&base, &(size, _))| (base, size)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: u64 = 2 << 20;

    fn windows() -> Windows {
        let mut w = Windows::default();
        w.add_window(0, Window { base: 100 * MIB2, size: 10 * MIB2, granularity: MIB2, free: 0 });
        w
    }

    #[test]
    fn only_whole_granules_inside_the_window_and_apart_are_made() {
        let mut w = windows();
        assert_eq!(w.refusal(0, 100 * MIB2, 2 * MIB2), None);
        w.mapped(0, 100 * MIB2, 2 * MIB2);
        // Overlapping the first, from below and from inside.
        assert!(w.refusal(0, 101 * MIB2, MIB2).is_some());
        assert!(w.refusal(0, 100 * MIB2, MIB2).is_some());
        // Right after it, up to the window's end.
        assert_eq!(w.refusal(0, 102 * MIB2, 8 * MIB2), None);
        // Past the end, before the start, not granules, empty, another device, wrapping.
        assert!(w.refusal(0, 102 * MIB2, 9 * MIB2).is_some());
        assert!(w.refusal(0, 98 * MIB2, MIB2).is_some());
        assert!(w.refusal(0, 102 * MIB2 + 4096, MIB2).is_some());
        assert!(w.refusal(0, 102 * MIB2, 4096).is_some());
        assert!(w.refusal(0, 102 * MIB2, 0).is_some());
        assert!(w.refusal(1, 102 * MIB2, MIB2).is_some());
        assert!(w.refusal(0, u64::MAX - MIB2 + 1, MIB2).is_some());
        // A range that covers an allocation entirely.
        w.mapped(0, 104 * MIB2, MIB2);
        assert!(w.refusal(0, 103 * MIB2, 3 * MIB2).is_some());
        assert_eq!(w.allocation(104 * MIB2), Some((MIB2, 0)));
        assert_eq!(w.on_device(0), [(100 * MIB2, 2 * MIB2), (104 * MIB2, MIB2)]);
        assert!(w.on_device(1).is_empty());
        w.unmapped(104 * MIB2);
        assert_eq!(w.refusal(0, 103 * MIB2, 3 * MIB2), None);
        assert_eq!(w.allocation(104 * MIB2), None);
    }

    proptest::proptest! {
        /// Whatever a client asks (granule-sized or not, inside the window or around it),
        /// a part is made exactly when it is whole granules inside the window and apart
        /// from every part made and not freed.
        #[test]
        fn parts_are_made_exactly_when_they_fit(
            ops in proptest::collection::vec((0u64..16, 0u64..5, 0u64..4, proptest::bool::ANY), 1..80)
        ) {
            let mut w = windows();
            let mut made: Vec<(u64, u64)> = Vec::new();
            for (granule, len, skew, unmap) in ops {
                // Granules 96..112 around the window's 100..110; a skew of 1 is no granule.
                let address = (96 + granule) * MIB2 + if skew == 1 { 4096 } else { 0 };
                let size = len * MIB2;
                if unmap {
                    let known = w.allocation(address);
                    proptest::prop_assert_eq!(known.is_some(), made.iter().any(|&(a, _)| a == address));
                    w.unmapped(address);
                    made.retain(|&(a, _)| a != address);
                    continue;
                }
                let fits = size > 0
                    && skew != 1
                    && address >= 100 * MIB2
                    && address + size <= 110 * MIB2
                    && made.iter().all(|&(a, l)| address + size <= a || a + l <= address);
                proptest::prop_assert_eq!(w.refusal(0, address, size).is_none(), fits);
                if fits {
                    w.mapped(0, address, size);
                    made.push((address, size));
                }
            }
        }
    }
}
